"""BatchCreateTasks through google-cloud-tasks, and what its operation says about each task.

docs/platform-facts.md, "Cloud Tasks: BatchCreateTasks": the operation's response lists the
tasks created; its metadata maps the index of each failed request to its status. Read here:
ALREADY_EXISTS means the name was taken, as for CreateTask; another status a retry cannot
change is that task's error. Uncertain, so left for the producer to create singly: a task with
a transient status, a task the answer does not mention (a FAILED or CANCELLED operation), and
every task of an operation not done within the timeout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from google.api_core import exceptions as api
from google.cloud import tasks_v2

from tasklease.producer.cloud_tasks_wire import raise_translated, to_proto, translate
from tasklease.producer.errors import (
    PermanentEnqueueError,
    TaskAlreadyExists,
)
from tasklease.producer.transport import BatchOutcome, TaskRequest

MAX_BATCH = 100  # "A maximum of 100 tasks can be created in a single batch."
_OK = 0  # google.rpc.Code.OK


def create_tasks(
    client: Any, tasks: Sequence[TaskRequest], request_id: str, timeout: float
) -> BatchOutcome:
    """One BatchCreateTasks call (waiting for its operation at most ``timeout`` more)."""
    try:
        future = client.batch_create_tasks(
            request=batch_request(tasks, request_id), timeout=timeout, retry=None
        )
    except Exception as exc:
        raise_translated(exc, tasks[0], batch=True)
    if not future.operation.done:
        # Polls GetOperation; an operation that ends in an error raises, its metadata stays.
        with contextlib.suppress(api.GoogleAPICallError, TimeoutError):
            future.result(timeout=timeout)
    return outcome(future.operation, tasks)


def batch_request(
    tasks: Sequence[TaskRequest], request_id: str
) -> tasks_v2.BatchCreateTasksRequest:
    """The BatchCreateTasksRequest of ``tasks`` (one queue)."""
    parent = tasks[0].queue_path
    return tasks_v2.BatchCreateTasksRequest(
        parent=parent,
        requests=[tasks_v2.CreateTaskRequest(parent=parent, task=to_proto(t)) for t in tasks],
        request_id=request_id,
    )


def outcome(operation: Any, tasks: Sequence[TaskRequest]) -> BatchOutcome:
    """What a google.longrunning Operation of BatchCreateTasks says for certain."""
    if not operation.done:
        return BatchOutcome()
    names = {task.name for task in tasks}
    created: set[str] = set()
    if operation.HasField("response"):
        response = tasks_v2.BatchCreateTasksResponse.deserialize(operation.response.value)
        created = {task.name for task in response.tasks} & names
    existed: set[str] = set()
    failed: dict[str, PermanentEnqueueError] = {}
    if operation.HasField("metadata"):
        metadata = tasks_v2.BatchCreateTasksMetadata.deserialize(operation.metadata.value)
        for index, status in metadata.failed_requests.items():
            if not 0 <= index < len(tasks) or status.code == _OK:
                continue  # Not a request of ours, or no error: say nothing.
            task = tasks[index]
            status_error = api.from_grpc_status(status.code, status.message)
            error = translate(status_error, task)
            if isinstance(error, TaskAlreadyExists):
                existed.add(task.name)
            elif isinstance(error, PermanentEnqueueError):
                failed[task.name] = error
    return BatchOutcome(frozenset(created - existed), frozenset(existed), failed)
