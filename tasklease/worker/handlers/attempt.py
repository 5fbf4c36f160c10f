"""The live state of one claimed attempt: the lease it last confirmed, the lock it holds, and
whether it has lost them.

Owned by the executor (the claim, the lock it takes and gives back) and the lease keeper (each
renewal it confirms, a loss it finds); a handler reads it only through its
:class:`~tasklease.worker.handlers.context.TaskContext`, a read-only view.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tasklease.errors import Cancelled, LeaseLost
from tasklease.joins import Member
from tasklease.worker.runtime.clock import REAL_TIMING, Timing

if TYPE_CHECKING:
    from tasklease.worker.core.records import RunRecord

# The transactional step the calling code runs inside, as (its attempt, its transaction). A
# context variable, not the attempt's state: a handler's other steps, on other threads or
# asyncio tasks, are beside that step, not inside it.
_STEP_TRANSACTION: ContextVar[tuple[Attempt, Any] | None] = ContextVar(
    "tasklease_step_transaction", default=None
)


@dataclass(eq=False, slots=True, weakref_slot=True)
class Attempt:
    """One attempt of a run, from its claim to its finish."""

    kind: str
    handler: str
    run_id: str
    attempt_id: str
    lease_expires: datetime
    # The lock this execution holds (an exclusive job's, or its concurrency key's), renewed
    # and released with the run; its fencing token grows with every holder of the lock.
    lock: str | None = None
    lock_fencing_token: int | None = None
    # The store's native transaction while a transactional handler runs in it, else None
    # (a transactional step's is in_step_transaction's, for its own execution only).
    transaction: Any = None
    # The join this attempt's run is a child of (a fan-out with then=): counted when it ends.
    fan_in: Member | None = None
    # The run a plain fan-out's child was fanned out by (PARENT_HEADER): its continuations
    # carry it, so a cancelled parent stops them too.
    parent_run_id: str | None = None
    number: int = 1  # Which claim of the run this is (the record's attempts).
    # The local clock the lease is measured by, and the pause before a store write's retry.
    timing: Timing = field(default=REAL_TIMING, repr=False)
    # Set once, by the keeper's thread or a lease check, and never cleared; nothing waits on
    # it, so a plain attribute does (one store, atomic).
    _lost: bool = field(default=False, repr=False)
    # Set once, when a step's write or a renewal returns the run's record marked cancelled.
    _cancelled: bool = field(default=False, repr=False)
    # time.monotonic() at which the lease this attempt last confirmed runs out, counted from
    # before the store call that confirmed it, so never later than the lease the store holds.
    _deadline: float = field(default=math.inf, repr=False)

    @property
    def lease_lost(self) -> bool:
        """True once a renewal found the run taken over, or once the lease this attempt last
        confirmed has run out by the local monotonic clock, whatever the store would say: an
        instance cut off from its store must stop before another may take the run over."""
        if self._lost:
            return True
        if self.timing.monotonic() >= self._deadline:
            self._lost = True  # Lost for good: a later renewal cannot undo a possible takeover.
            return True
        return False

    @property
    def current_transaction(self) -> Any:
        """The store transaction the calling code runs in, else None: the transactional step
        it runs inside (on this thread or asyncio task, not a concurrent step's), else the
        transactional handler's."""
        inside = _STEP_TRANSACTION.get()
        if inside is not None and inside[0] is self:
            return inside[1]
        return self.transaction

    @contextmanager
    def in_step_transaction(self, transaction: Any) -> Iterator[None]:
        """Run the body inside this attempt's transactional step, whose store transaction is
        ``transaction``: on this thread, and in the asyncio tasks it starts (they copy its
        context), but not in steps running beside it."""
        token = _STEP_TRANSACTION.set((self, transaction))
        try:
            yield
        finally:
            _STEP_TRANSACTION.reset(token)

    @property
    def lease_seconds_left(self) -> float:
        """Seconds until the confirmed lease runs out by the local clock (0 once lost)."""
        if self.lease_lost:
            return 0.0
        return max(0.0, self._deadline - self.timing.monotonic())

    @property
    def lease_deadline(self) -> float:
        """The ``timing.monotonic()`` at which the confirmed lease runs out (inf: unconfirmed)."""
        return self._deadline

    def confirm_lease(self, lease_expires: datetime, deadline: float) -> None:
        """Record a claim or renewal the store confirmed; ``deadline`` is in monotonic time."""
        self.lease_expires = lease_expires
        self._deadline = deadline

    def mark_lease_lost(self) -> None:
        """Called by the lease keeper when a renewal finds the claim gone."""
        self._lost = True

    @property
    def cancelled(self) -> bool:
        """True once a step's write or a lease renewal found the run cancelled."""
        return self._cancelled

    def note_record(self, record: RunRecord) -> None:
        """Learn what ``record`` (written by this attempt: a step, a renewal) says of the
        run beyond the lease: a cancellation's mark."""
        if record.cancelled_at is not None:
            self._cancelled = True

    def check_cancelled(self) -> None:
        """Raise :class:`Cancelled` if the run was found cancelled."""
        if self._cancelled:
            raise Cancelled(f"run {self.run_id} was cancelled: it ends at this step")

    def check_lease(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost."""
        if self.lease_lost:
            raise LeaseLost(
                f"run {self.run_id}: attempt {self.attempt_id} lost its lease (taken over, or "
                "not renewed in time) and must stop"
            )
