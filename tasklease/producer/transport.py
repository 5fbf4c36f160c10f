"""The producer's plug-in point: how a task reaches a queue."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime, timedelta


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


class TaskTransport(ABC):
    """Creates tasks. Implement :meth:`create_task`.

    Called from many threads at once (``enqueue_many``): an implementation must be
    thread-safe. It makes one attempt and reports how it went only through its return or
    these exceptions (the producer does the retrying):

    - :class:`~tasklease.producer.errors.TaskAlreadyExists`: the name exists or existed recently;
    - :class:`~tasklease.producer.errors.TransientEnqueueError`: worth retrying;
    - :class:`~tasklease.producer.errors.PermanentEnqueueError`: not worth retrying, with what to
      fix.
    """

    @abstractmethod
    def create_task(self, task: TaskRequest, timeout: float) -> None:
        """Create ``task``, waiting at most ``timeout`` seconds."""

    def close(self) -> None:  # noqa: B027 - optional hook.
        """Release connections."""
