"""A run's attempts as bars on a time line, from what its record keeps. Pure: records in.

The record keeps its latest attempt only: its id, fencing token, claim time, lease end (moved
by each renewal, so the last renewal's) and finish time. Earlier attempts leave their count
(``attempts``) and, through the fencing token, a bound on their tokens; not their times, not
who took over from whom, not how many renewals. A timeline says so rather than draw them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from tasklease.protocol import rfc3339
from tasklease.worker.core.queries import is_stuck
from tasklease.worker.core.records import RunRecord, RunStatus

OPERATOR_NOTE = "released by an operator"  # decisions.operator_release's note starts so.


class BarEnd(StrEnum):
    """How an attempt's bar ends."""

    COMPLETED = "completed"  # At finished_at: the handler returned.
    FAILED = "failed"  # At finished_at: a dead letter.
    SKIPPED = "skipped"  # At finished_at: another run held the lock; nothing ran.
    CANCELLED = "cancelled"  # At finished_at: cancelled (tasklease.cancel); never runs again.
    RELEASED = "released"  # At the release (lease_expires): given back for a retry.
    WAITING = "waiting"  # At the suspension (lease_expires): waits for a signal, holding nothing.
    LAPSED = "lapsed"  # At lease_expires, passed: the holder crashed or hangs.
    RUNNING = "running"  # Now; the lease runs on to lease_expires.
    PENDING = "pending"  # A replay written before its first delivery: no attempt yet.


@dataclass(frozen=True)
class Bar:
    """One run's latest attempt: from ``start`` to ``end``; ``lease_until`` the lease's end
    when it runs past ``end`` (a live attempt)."""

    role: str  # "this run", "replay of", "replayed as".
    run_id: str
    attempt_id: str
    fencing_token: int
    attempt: int  # Its number in the run's current chain of attempts (record.attempts).
    start: datetime
    end: datetime
    ends: BarEnd
    lease_until: datetime | None = None
    by_operator: bool = False  # The claim was given back by an operator, not the handler.

    @property
    def earlier(self) -> int:
        """Attempts before this one whose times the record does not keep."""
        return max(self.attempt - 1, 0)


@dataclass(frozen=True)
class Timeline:
    """The bars to draw (this run's, and the runs its replay links name, when read), oldest
    first, between ``start`` and ``end``; ``notes`` say what the record does not keep."""

    bars: list[Bar]
    start: datetime
    end: datetime
    notes: list[str] = field(default_factory=list)

    def position(self, moment: datetime) -> float:
        """Where ``moment`` falls, from 0 (``start``) to 1 (``end``)."""
        span = (self.end - self.start).total_seconds()
        if span <= 0:
            return 0.0
        return min(max((moment - self.start).total_seconds() / span, 0.0), 1.0)


def bar(record: RunRecord, now: datetime, role: str = "this run") -> Bar:
    """``record``'s latest attempt as a bar at ``now``."""
    start = record.claimed_at
    lease_until = None
    by_operator = False
    if record.status is RunStatus.WAITING:  # Its attempts count again from the resume.
        end, ends = record.lease_expires, BarEnd.WAITING
    elif record.attempts == 0:
        end, ends = start, BarEnd.PENDING
    elif record.status is RunStatus.IN_PROGRESS:
        if is_stuck(record, now):
            end, ends = record.lease_expires, BarEnd.LAPSED
        else:
            end, ends, lease_until = max(now, start), BarEnd.RUNNING, record.lease_expires
    elif record.status is RunStatus.RELEASED:
        end, ends = record.lease_expires, BarEnd.RELEASED
        by_operator = (record.error or "").startswith(OPERATOR_NOTE)
    else:
        end = record.finished_at or record.lease_expires
        ends = BarEnd(record.status.value)
    return Bar(
        role,
        record.run_id,
        record.attempt_id,
        record.fencing_token,
        record.attempts,
        start,
        max(end, start),
        ends,
        lease_until,
        by_operator,
    )


def timeline(
    record: RunRecord,
    now: datetime,
    *,
    replay_of: RunRecord | None = None,
    replayed_as: RunRecord | None = None,
) -> Timeline:
    """The run's attempt timeline at ``now``, with the runs its replay links name (when the
    caller read them) as bars of their own."""
    bars = [bar(record, now)]
    if replay_of is not None:
        bars.insert(0, bar(replay_of, now, "replay of"))
    if replayed_as is not None:
        bars.append(bar(replayed_as, now, "replayed as"))
    start = min(b.start for b in bars)
    end = max(max(b.end, b.lease_until or b.end) for b in bars)
    if end <= start:
        end = start + timedelta(seconds=1)
    return Timeline(bars, start, end, _notes(record, bars))


def _notes(record: RunRecord, bars: list[Bar]) -> list[str]:
    own = next(b for b in bars if b.role == "this run")
    notes = []
    if own.earlier:
        tokens = f"fencing tokens below {own.fencing_token}" if own.fencing_token > 1 else ""
        notes.append(
            f"{own.earlier} earlier attempt{'s' if own.earlier > 1 else ''} "
            f"({tokens + ', ' if tokens else ''}each ended by a release or a takeover): "
            "the record keeps only the latest attempt, so their times are not drawn."
        )
    if own.ends in (BarEnd.RUNNING, BarEnd.LAPSED):
        notes.append(
            "Renewals move the lease's end; the record keeps the last one "
            f"({rfc3339(record.lease_expires, 'seconds')}), not how many there were."
        )
    if own.by_operator:
        notes.append(
            "An operator released it: the attempt id and fencing token shown are the "
            "release's, which fenced the holder out."
        )
    if own.ends is BarEnd.PENDING:
        notes.append("A replay waiting for its first delivery: no attempt has run yet.")
    return notes
