"""What a handler learns about the execution it runs in."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from worker.errors import LeaseLost


@dataclass
class TaskContext:
    """One execution of a task or scheduled run, as the handler sees it.

    ``fencing_token`` grows with every new claim of the same run: pass it to downstream
    writes so they can reject a stale attempt whose lease was taken over. ``idempotency_key``
    is the same for every attempt of the run, shaped as a UUID because Google Cloud APIs'
    ``request_id`` fields require one.
    """

    kind: str
    handler: str
    run_id: str
    attempt_id: str
    fencing_token: int
    attempt: int  # Claims of this run so far, this one included: our own count.
    lease_expires: datetime
    body: bytes = b""
    queue: str | None = None
    task_name: str | None = None
    retry_count: int | None = None
    execution_count: int | None = None
    eta: datetime | None = None
    previous_response: int | None = None
    retry_reason: str | None = None
    job_name: str | None = None
    schedule_time: datetime | None = None
    project: str | None = None
    location: str | None = None
    _lost: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def idempotency_key(self) -> str:
        """Stable across retries of this run; a UUID-shaped string derived from the run id."""
        return str(uuid.UUID(self.run_id[:32]))

    @property
    def lease_lost(self) -> bool:
        """True once a renewal found that another attempt took the run over."""
        return self._lost.is_set()

    def check_lease(self) -> None:
        """Raise :class:`LeaseLost` if the run was taken over; call it between steps."""
        if self.lease_lost:
            raise LeaseLost(
                f"run {self.run_id} was taken over; attempt {self.attempt_id} must stop"
            )

    def mark_lease_lost(self) -> None:
        """Called by the lease keeper when a renewal finds the claim gone."""
        self._lost.set()
