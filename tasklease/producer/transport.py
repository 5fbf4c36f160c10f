"""The producer's plug-in point: how a task reaches a queue."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import ClassVar

from tasklease.producer.errors import PermanentEnqueueError


@dataclass(frozen=True)
class TaskRequest:
    """One named HTTP task, independent of any client library."""

    queue_path: str  # projects/P/locations/L/queues/Q
    task_id: str
    url: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    service_account: str | None = None  # Adds an OIDC token for this account.
    audience: str | None = None
    schedule_time: datetime | None = None
    dispatch_deadline: timedelta | None = None

    @property
    def name(self) -> str:
        """The full task resource name."""
        return f"{self.queue_path}/tasks/{self.task_id}"


@dataclass(frozen=True)
class BatchOutcome:
    """What one batch create said for certain about its tasks, by task name.

    ``created``: created by this batch; ``existed``: the name was taken; ``failed``: refused,
    retrying cannot help. A task in none of them is uncertain (a transient error, or the
    answer did not say): the producer creates it on its own.
    """

    created: frozenset[str] = frozenset()
    existed: frozenset[str] = frozenset()
    failed: Mapping[str, PermanentEnqueueError] = field(default_factory=dict)


class TaskTransport(ABC):
    """Creates tasks. Implement :meth:`create_task` (and, for batches, :meth:`create_tasks`).

    Called from many threads at once (``enqueue_many``): an implementation must be
    thread-safe. It makes one attempt and reports how it went only through its return or
    these exceptions (the producer does the retrying):

    - :class:`~tasklease.producer.errors.TaskAlreadyExists`: the name exists or existed recently;
    - :class:`~tasklease.producer.errors.TransientEnqueueError`: worth retrying;
    - :class:`~tasklease.producer.errors.PermanentEnqueueError`: not worth retrying, with what to
      fix.
    """

    # The most tasks :meth:`create_tasks` takes at once; 0: it is not implemented.
    max_batch_size: ClassVar[int] = 0

    @abstractmethod
    def create_task(self, task: TaskRequest, timeout: float) -> None:
        """Create ``task``, waiting at most ``timeout`` seconds."""

    def create_tasks(
        self, tasks: Sequence[TaskRequest], request_id: str, timeout: float
    ) -> BatchOutcome:
        """Create ``tasks`` (one queue, at most :attr:`max_batch_size`) in one attempt.

        ``request_id`` is the same when the producer retries the same batch; a repeated one
        must get the first call's answer back, as Cloud Tasks gives it (the producer reads
        a task reported as existing as ``created=False``, even on a retry). Raises what
        :meth:`create_task` raises for a fault of the whole batch.
        """
        raise NotImplementedError(f"{type(self).__name__} creates tasks one at a time")

    def close(self) -> None:  # noqa: B027 - optional hook.
        """Release connections."""
