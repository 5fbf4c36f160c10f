"""tasklease producer: enqueue named, de-duplicated Cloud Tasks for the worker.

producer = Producer.from_env()
producer.enqueue("send_receipt", {"order_id": 42}, key="order-42")
"""

from producer.cloud_tasks import CloudTasksTransport
from producer.errors import (
    EnqueueError,
    FanOutIncomplete,
    InvalidTask,
    PermanentEnqueueError,
    TaskAlreadyExists,
    TransientEnqueueError,
)
from producer.memory import MemoryTransport
from producer.naming import task_id
from producer.producer import EnqueueResult, Producer
from producer.retry import RetryPolicy
from producer.transport import TaskRequest, TaskTransport

__all__ = [
    "CloudTasksTransport",
    "EnqueueError",
    "EnqueueResult",
    "FanOutIncomplete",
    "InvalidTask",
    "MemoryTransport",
    "PermanentEnqueueError",
    "Producer",
    "RetryPolicy",
    "TaskAlreadyExists",
    "TaskRequest",
    "TaskTransport",
    "TransientEnqueueError",
    "task_id",
]
