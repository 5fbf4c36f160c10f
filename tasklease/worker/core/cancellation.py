"""Cancelling a run: the pure rules. No I/O, no clock reads.

A run nothing runs (released for a retry, waiting for a signal, between continuations, or
whose holder's lease has run out) is cancelled at once: its record says ``cancelled``, and
every later delivery of it is answered 200 without running. A run an attempt holds is marked
(``cancelled_by``, ``cancelled_at``) and stays in progress: its holder sees the mark at its
next step or lease renewal and ends the run ``cancelled``; if the holder dies first, its
lease runs out and the next delivery finds the mark and ends it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from tasklease.worker.core import decisions
from tasklease.worker.core.records import RunRecord, RunStatus

# A run that has ended: nothing left to cancel.
ENDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.SKIPPED})


class Cancelled(StrEnum):
    """What a cancellation found."""

    CANCELLED = "cancelled"  # Nothing ran it: cancelled now.
    STOPPING = "stopping"  # An attempt runs it: it ends the run at its next step or renewal.
    ALREADY = "already"  # Cancelled before (or asked to be, while running).
    ENDED = "ended"  # It completed, failed or was skipped: nothing to cancel.
    MISSING = "missing"  # No such run, or past its retention.

    @property
    def accepted(self) -> bool:
        """Whether the run is (or will be) cancelled: ``tasklease.cancel``'s answer."""
        return self in (Cancelled.CANCELLED, Cancelled.STOPPING, Cancelled.ALREADY)


@dataclass(frozen=True)
class CancelDecision:
    """What a cancellation found, and the record as it stands afterwards."""

    outcome: Cancelled
    record: RunRecord | None


def note(by: str) -> str:
    """The error text a cancelled run's record keeps."""
    return f"cancelled by {by}"


def ended_cancelled(record: RunRecord, now: datetime) -> RunRecord:
    """The record of a run ended by its cancellation: cancelled, never run again. The
    holder's lease ends now."""
    by = record.cancelled_by or "an operator"
    return record.replace(
        status=RunStatus.CANCELLED,
        finished_at=now,
        lease_expires=min(record.lease_expires, now),
        error=note(by),
        cancelled_by=by,
        cancelled_at=record.cancelled_at or now,
        payload=None,
    )


def cancelled(
    record: RunRecord | None, by: str, now: datetime, *, live: bool
) -> tuple[RunRecord | None, CancelDecision]:
    """The record to write (None: nothing) when ``by`` cancels the run at ``now``, and the
    decision. ``live``: whether ``record`` is within its retention."""
    if record is None or not live:
        return None, CancelDecision(Cancelled.MISSING, record)
    if record.status is RunStatus.CANCELLED or record.cancelled_at is not None:
        return None, CancelDecision(Cancelled.ALREADY, record)
    if record.status in ENDED:
        return None, CancelDecision(Cancelled.ENDED, record)
    marked = record.replace(cancelled_by=by, cancelled_at=now)
    if decisions.lease_held(record, now):
        return marked, CancelDecision(Cancelled.STOPPING, marked)
    written = ended_cancelled(marked, now)
    return written, CancelDecision(Cancelled.CANCELLED, written)
