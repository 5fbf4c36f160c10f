"""The run record a store keeps per task or scheduled run, and the claim a store hands out."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any


class RunStatus(StrEnum):
    """Where a run stands in the store."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"  # Permanently: a dead-letter record, never run again by a retry.
    RELEASED = "released"  # A retryable failure gave the claim back; the next delivery runs it.
    SKIPPED = "skipped"  # An exclusive job's run found another run holding the job: not run.
    WAITING = "waiting"  # Suspended in ctx.wait_for: its signal or its timeout resumes it.
    CANCELLED = "cancelled"  # Cancelled by tasklease.cancel: never runs again.


class Verdict(StrEnum):
    """What an atomic claim decided for one delivery."""

    CLAIMED = "claimed"  # This delivery holds the lease and must run the handler.
    COMPLETED = "completed"  # Done before: answer 200 with the stored result.
    FAILED = "failed"  # Failed permanently before: answer 200, do not run.
    IN_PROGRESS = "in_progress"  # Another attempt holds an unexpired lease: answer 409.
    FORBIDDEN = "forbidden"  # The run belongs to another caller: answer 403, reveal nothing.
    SKIPPED = "skipped"  # Skipped as an overlap before: answer 200, do not run.
    WAITING = "waiting"  # Waits for a signal not yet sent, or a timeout not yet due: do not run.
    CANCELLED = "cancelled"  # Cancelled: answer 200, never run again.


@dataclass(frozen=True)
class RunRecord:
    """Everything a store keeps about one run. Times are timezone-aware UTC datetimes."""

    run_id: str
    kind: str
    handler: str
    status: RunStatus
    attempt_id: str
    fencing_token: int
    attempts: int
    lease_expires: datetime
    expire_at: datetime
    claimed_at: datetime
    identity: dict[str, str] = field(default_factory=dict)
    finished_at: datetime | None = None
    # The handler's return value as JSON text, serialised once when the run completed, so the
    # first answer and every duplicate's carry the same bytes on every store.
    result_json: str | None = None
    error: str | None = None
    payload: str | None = None  # Kept on failed runs so they can be inspected and replayed.
    caller: str | None = None  # The verified principal whose delivery created the run.
    # Operator replays (``tasklease runs replay``): the run this one re-runs, and the run that
    # re-ran this one. Kept across claims, so the link survives the replay's own retries.
    replay_of: str | None = None
    replayed_as: str | None = None
    # Durable steps (tasklease.worker.core.steps): the run's completed steps and its last
    # continuation, as JSON text. Kept across claims, purged with the run.
    steps_json: str | None = None
    continuation_json: str | None = None
    # Durable waits (tasklease.worker.core.waits): the wait the run is suspended on, and the
    # signals it was sent, pending and delivered, as JSON text. Kept across claims.
    waits_json: str | None = None
    # Cancellation: who asked for it, and when. Set on a running run too, whose holder ends
    # it at its next step or lease renewal; kept across claims.
    cancelled_by: str | None = None
    cancelled_at: datetime | None = None

    @property
    def result(self) -> Any:
        """The stored result, decoded (None if there is none)."""
        return None if self.result_json is None else json.loads(self.result_json)

    def replace(self, **changes: Any) -> RunRecord:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ClaimRequest:
    """What a delivery asks the store for: the run, and how long to hold and keep it."""

    run_id: str
    kind: str
    handler: str
    attempt_id: str
    lease: timedelta
    retention: timedelta
    identity: dict[str, str] = field(default_factory=dict)
    caller: str | None = None  # The verified principal, when authentication is on.


@dataclass(frozen=True)
class Claim:
    """The store's answer to a :class:`ClaimRequest`.

    ``record`` is the record as it stands after the claim: ours when ``verdict`` is
    ``CLAIMED``, the existing one otherwise. ``took_over_from`` names the attempt whose expired
    lease (or released claim) this claim replaced.
    """

    verdict: Verdict
    record: RunRecord
    took_over_from: str | None = None


@dataclass(frozen=True)
class LockRecord:
    """A named lock (an exclusive job, or one concurrency key of a task handler), held by one
    attempt of one run under the same renewing lease as that run.

    The record stays after a release: it remembers the last holder, whose start ``min_gap``
    counts from, until it lapses (:func:`tasklease.worker.core.locking.lapses_at`) and a store may
    delete it. Its fencing token grows past that too
    (:func:`tasklease.worker.core.locking.next_token`).
    """

    name: str
    holder_run_id: str
    holder_attempt_id: str
    fencing_token: int  # Grows with every grant; at least the grant's time in microseconds.
    started_at: datetime  # When the holder acquired it.
    lease_expires: datetime  # The holder's lease, renewed with its run's; now on release.
    # The safety expiry for a holder that stopped renewing (ShedLock's lockAtMostFor): a
    # holder whose lease lapsed still blocks other runs until then. started_at + max_runtime,
    # or started_at when there is none; now on release.
    safety_expires: datetime
    next_start_at: datetime  # No other run starts before this: started_at + min_gap.
    released_at: datetime | None = None

    @property
    def released(self) -> bool:
        return self.released_at is not None

    def replace(self, **changes: Any) -> LockRecord:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class LockRequest:
    """What one claimed attempt asks for: the lock ``name``, held under its run's lease."""

    name: str
    run_id: str
    attempt_id: str
    lease: timedelta
    max_runtime: timedelta | None = None
    min_gap: timedelta = timedelta(0)


@dataclass(frozen=True)
class LockGrant:
    """The store's answer to a :class:`LockRequest`: ``lock`` as it stands afterwards (ours
    when ``acquired``, the holder's otherwise). ``free_at`` is the earliest moment the lock
    can be free for another run, when busy; ``took_over_from`` names the run whose lapsed
    hold this acquisition replaced."""

    acquired: bool
    lock: LockRecord
    free_at: datetime | None = None
    took_over_from: str | None = None
