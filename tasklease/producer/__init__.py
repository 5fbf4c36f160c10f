"""tasklease producer: enqueue named, de-duplicated Cloud Tasks for the worker.

producer = Producer.from_env()
producer.enqueue("send_receipt", {"order_id": 42}, key="order-42")

async with AsyncProducer.from_env() as producer:  # From async code.
    await producer.enqueue("send_receipt", {"order_id": 42}, key="order-42")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasklease.lazy import lazy_exports

if TYPE_CHECKING:
    from tasklease.producer.async_producer import AsyncProducer
    from tasklease.producer.async_transport import AsyncTaskTransport, CloudTasksAsyncTransport
    from tasklease.producer.cloud_tasks import CloudTasksTransport
    from tasklease.producer.errors import (
        EnqueueError,
        InvalidTask,
        PermanentEnqueueError,
        TaskAlreadyExists,
        TransientEnqueueError,
    )
    from tasklease.producer.memory import MemoryTransport
    from tasklease.producer.naming import task_id
    from tasklease.producer.producer import Producer
    from tasklease.producer.results import EnqueueResult, FanOutIncomplete
    from tasklease.producer.retry import RetryPolicy
    from tasklease.producer.transport import BatchOutcome, TaskRequest, TaskTransport

# Each public name and the module that defines it (imported when the name is first read).
_EXPORTS: dict[str, str] = {
    "AsyncProducer": "tasklease.producer.async_producer",
    "AsyncTaskTransport": "tasklease.producer.async_transport",
    "CloudTasksAsyncTransport": "tasklease.producer.async_transport",
    "BatchOutcome": "tasklease.producer.transport",
    "CloudTasksTransport": "tasklease.producer.cloud_tasks",
    "EnqueueError": "tasklease.producer.errors",
    "FanOutIncomplete": "tasklease.producer.results",
    "InvalidTask": "tasklease.producer.errors",
    "PermanentEnqueueError": "tasklease.producer.errors",
    "TaskAlreadyExists": "tasklease.producer.errors",
    "TransientEnqueueError": "tasklease.producer.errors",
    "MemoryTransport": "tasklease.producer.memory",
    "task_id": "tasklease.producer.naming",
    "EnqueueResult": "tasklease.producer.results",
    "Producer": "tasklease.producer.producer",
    "RetryPolicy": "tasklease.producer.retry",
    "TaskRequest": "tasklease.producer.transport",
    "TaskTransport": "tasklease.producer.transport",
}

__all__ = [
    "AsyncProducer",
    "AsyncTaskTransport",
    "BatchOutcome",
    "CloudTasksAsyncTransport",
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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
