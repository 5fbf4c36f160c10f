"""What a handler learns about the execution it runs in."""

from __future__ import annotations

import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from tasklease.errors import LeaseLost


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
    # The lock this execution holds (an exclusive job's, or its concurrency key's), renewed
    # and released with the run; its fencing token grows with every holder of the lock.
    lock: str | None = None
    lock_fencing_token: int | None = None
    _lost: threading.Event = field(default_factory=threading.Event, repr=False)
    # time.monotonic() at which the lease this attempt last confirmed runs out, counted from
    # before the store call that confirmed it, so never later than the lease the store holds.
    _deadline: float = field(default=math.inf, repr=False)

    @property
    def idempotency_key(self) -> str:
        """Stable across retries of this run; a UUID-shaped string derived from the run id."""
        return str(uuid.UUID(self.run_id[:32]))

    @property
    def lease_lost(self) -> bool:
        """True once a renewal found the run taken over, or once the lease this attempt last
        confirmed has run out by the local monotonic clock, whatever the store would say: an
        instance cut off from its store must stop before another may take the run over."""
        if self._lost.is_set():
            return True
        if time.monotonic() >= self._deadline:
            self._lost.set()  # Lost for good: a later renewal cannot undo a possible takeover.
            return True
        return False

    @property
    def lease_seconds_left(self) -> float:
        """Seconds until the confirmed lease runs out by the local clock (0 once lost)."""
        if self.lease_lost:
            return 0.0
        return max(0.0, self._deadline - time.monotonic())

    @property
    def lease_deadline(self) -> float:
        """The ``time.monotonic()`` at which the confirmed lease runs out (inf: unconfirmed)."""
        return self._deadline

    def confirm_lease(self, lease_expires: datetime, deadline: float) -> None:
        """Record a claim or renewal the store confirmed; ``deadline`` is in monotonic time."""
        self.lease_expires = lease_expires
        self._deadline = deadline

    def check_lease(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost; call it between steps."""
        if self.lease_lost:
            raise LeaseLost(
                f"run {self.run_id}: attempt {self.attempt_id} lost its lease (taken over, or "
                "not renewed in time) and must stop"
            )

    def mark_lease_lost(self) -> None:
        """Called by the lease keeper when a renewal finds the claim gone."""
        self._lost.set()
