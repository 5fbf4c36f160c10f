"""Cancelling a run: the pure rules. No I/O, no clock reads.

A run nothing runs (released for a retry, waiting for a signal, between continuations, or
whose holder's lease has run out) is cancelled at once: its record says ``cancelled``, and
every later delivery of it is answered 200 without running. A run an attempt holds is marked
(``cancelled_by``, ``cancelled_at``) and stays in progress: its holder sees the mark at its
next step or lease renewal and ends the run ``cancelled``; if the holder dies first, its
lease runs out and the next delivery (or another cancellation) finds the mark and ends it
the same way. A holder that finishes before it sees the mark has finished: its completion
(or failure) stands, the mark kept beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from tasklease.worker.core import decisions
from tasklease.worker.core.records import RunRecord, RunStatus

# A run that has ended: nothing left to cancel.
ENDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.SKIPPED})


class CancelOutcome(StrEnum):
    """What a cancellation found."""

    CANCELLED = "cancelled"  # Nothing ran it: cancelled now.
    STOPPING = "stopping"  # An attempt runs it: it ends the run at its next step or renewal.
    ALREADY = "already"  # Cancelled before (or asked to be, while running).
    ENDED = "ended"  # It completed, failed or was skipped: nothing to cancel.
    MISSING = "missing"  # No such run, or past its retention.

    @property
    def accepted(self) -> bool:
        """Whether the run is (or will be) cancelled: ``tasklease.cancel``'s answer."""
        return self in (CancelOutcome.CANCELLED, CancelOutcome.STOPPING, CancelOutcome.ALREADY)


@dataclass(frozen=True)
class CancelDecision:
    """What a cancellation found, and the record as it stands afterwards."""

    outcome: CancelOutcome
    record: RunRecord | None


def note(by: str) -> str:
    """The error text a cancelled run's record keeps."""
    return f"cancelled by {by}"


def parent_note(parent_run_id: str) -> str:
    """Who cancelled a fan-out child: its parent's cancellation, named by the parent."""
    return f"the cancellation of its parent run {parent_run_id}"


def is_cancelled(record: RunRecord | None) -> bool:
    """Whether ``record``'s run is cancelled or marked to be: none of its deliveries, and
    none of its fan-out children's, may start anything new. A run that ended before its
    holder saw the mark is not: it finished."""
    if record is None:
        return False
    if record.status is RunStatus.CANCELLED:
        return True
    return record.cancelled_at is not None and record.status not in ENDED


def ended_cancelled(record: RunRecord, now: datetime, by: str | None = None) -> RunRecord:
    """The record of a run ended by its cancellation: cancelled, never run again. The
    holder's lease ends now. ``by`` names who cancelled a run its record does not mark
    (a fan-out child of a cancelled parent)."""
    who = record.cancelled_by or by or "an operator"
    return record.replace(
        status=RunStatus.CANCELLED,
        finished_at=now,
        lease_expires=min(record.lease_expires, now),
        error=note(who),
        cancelled_by=who,
        cancelled_at=record.cancelled_at or now,
        payload=None,
    )


def cancelled(
    record: RunRecord | None, by: str, now: datetime, *, live: bool
) -> tuple[RunRecord | None, CancelDecision]:
    """The record to write (None: nothing) when ``by`` cancels the run at ``now``, and the
    decision. ``live``: whether ``record`` is within its retention. A run marked before
    whose holder is gone is ended now (``ALREADY``: the first cancellation's)."""
    if record is None or not live:
        return None, CancelDecision(CancelOutcome.MISSING, record)
    if record.status is RunStatus.CANCELLED:
        return None, CancelDecision(CancelOutcome.ALREADY, record)
    if record.status in ENDED:
        return None, CancelDecision(CancelOutcome.ENDED, record)
    held = decisions.lease_held(record, now)
    if record.cancelled_at is not None:
        if held:
            return None, CancelDecision(CancelOutcome.ALREADY, record)
        written = ended_cancelled(record, now)
        return written, CancelDecision(CancelOutcome.ALREADY, written)
    marked = record.replace(cancelled_by=by, cancelled_at=now)
    if held:
        return marked, CancelDecision(CancelOutcome.STOPPING, marked)
    written = ended_cancelled(marked, now)
    return written, CancelDecision(CancelOutcome.CANCELLED, written)
