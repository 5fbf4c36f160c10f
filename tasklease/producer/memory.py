"""An in-process queue with Cloud Tasks' naming semantics, for tests and the in-process demo."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tasklease.producer.async_transport import AsyncTaskTransport
from tasklease.producer.errors import (
    PermanentEnqueueError,
    TaskAlreadyExists,
    TransientEnqueueError,
)
from tasklease.producer.transport import BatchOutcome, TaskRequest, TaskTransport


@dataclass
class QueuedTask:
    """A task the memory queue accepted, and how often it was delivered."""

    request: TaskRequest
    deliveries: int = 0
    done: bool = False


class MemoryTransport(TaskTransport):
    """Keeps created tasks in memory and refuses a name it has seen (Cloud Tasks keeps names
    of executed and deleted tasks for a while too; here, for the transport's lifetime).

    A batch is each task's :meth:`create_task` in turn, so a subclass that overrides only
    that still fails the tasks it means to; a repeated ``request_id`` gets its first answer
    back, as from Cloud Tasks."""

    max_batch_size = 100

    def __init__(self) -> None:
        self._tasks: dict[str, QueuedTask] = {}
        self._batches: dict[str, BatchOutcome] = {}  # By request_id.
        self._lock = threading.Lock()

    def create_task(self, task: TaskRequest, timeout: float) -> None:
        with self._lock:
            if task.name in self._tasks:
                raise TaskAlreadyExists(f"task {task.name} already exists")
            self._tasks[task.name] = QueuedTask(task)

    def create_tasks(
        self, tasks: Sequence[TaskRequest], request_id: str, timeout: float
    ) -> BatchOutcome:
        with self._lock:
            replayed = self._batches.get(request_id)
        if replayed is not None:
            return replayed
        created: set[str] = set()
        existed: set[str] = set()
        failed: dict[str, PermanentEnqueueError] = {}
        for task in tasks:
            try:
                self.create_task(task, timeout)
            except TaskAlreadyExists:
                existed.add(task.name)
            except PermanentEnqueueError as exc:
                failed[task.name] = exc
            except TransientEnqueueError:
                continue  # Uncertain: the producer creates it on its own.
            else:
                created.add(task.name)
        outcome = BatchOutcome(frozenset(created), frozenset(existed), failed)
        with self._lock:
            return self._batches.setdefault(request_id, outcome)

    @property
    def tasks(self) -> list[QueuedTask]:
        """Every task created, in creation order."""
        with self._lock:
            return list(self._tasks.values())

    def pending(self) -> list[QueuedTask]:
        """Tasks not yet delivered with a 2xx answer."""
        return [task for task in self.tasks if not task.done]

    def deliver(self, task: QueuedTask, post: Callable[..., Any], queue: str) -> int:
        """Deliver ``task`` once through ``post(path, headers=..., data=...)`` (a Flask test
        client's ``post``), with the headers Cloud Tasks sends; return the status code."""
        request = task.request
        path = "/" + request.url.split("://", 1)[-1].split("/", 1)[-1]
        headers = dict(request.headers)
        headers.update(
            {
                "X-CloudTasks-QueueName": queue,
                "X-CloudTasks-TaskName": request.task_id,
                "X-CloudTasks-TaskRetryCount": str(task.deliveries),
                "X-CloudTasks-TaskExecutionCount": str(task.deliveries),
            }
        )
        task.deliveries += 1
        status: int = post(path, headers=headers, data=request.body).status_code
        task.done = task.done or 200 <= status < 300
        return status


class AsyncMemoryTransport(AsyncTaskTransport):
    """A :class:`MemoryTransport` for an :class:`~tasklease.producer.AsyncProducer` (tests):
    the same tasks, created at once (nothing here waits)."""

    max_batch_size = MemoryTransport.max_batch_size

    def __init__(self, transport: MemoryTransport | None = None) -> None:
        self.transport = transport or MemoryTransport()

    async def create_task(self, task: TaskRequest, timeout: float) -> None:
        self.transport.create_task(task, timeout)

    async def create_tasks(
        self, tasks: Sequence[TaskRequest], request_id: str, timeout: float
    ) -> BatchOutcome:
        return self.transport.create_tasks(tasks, request_id, timeout)
