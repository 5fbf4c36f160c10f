"""What the store can tell about the last hour of each handler: runs per minute by how they
stand, claim-to-finish times, dead letters and stuck runs. Pure: records and ``now`` in.

A run record keeps its *latest* attempt only (``claimed_at``, ``finished_at``, ``status``,
``attempts``), so this counts runs by the minute of their latest claim, and times the latest
attempt from its claim to its finish. Deliveries that ran nothing (a duplicate answered from
the record, a 409 while another attempt held the lease, a lost claim) leave no trace in the
record: only the worker's ``tasklease.deliveries`` metric counts them.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from tasklease.worker.core.queries import is_stuck
from tasklease.worker.core.records import RunRecord, RunStatus

WINDOW = timedelta(hours=1)
BUCKET = timedelta(minutes=1)
# Stacking order, bottom first: settled runs under the ones still open.
STATES: tuple[str, ...] = ("completed", "skipped", "failed", "released", "in_progress", "stuck")


def state_of(record: RunRecord, now: datetime) -> str:
    """A run's state for the charts: its status, or ``stuck`` for an in-progress run whose
    lease expired."""
    return "stuck" if is_stuck(record, now) else record.status.value


def handler_seconds(record: RunRecord) -> float | None:
    """The latest attempt's claim-to-finish time, for a run that ran its handler to an end
    (completed or failed); None otherwise (a release keeps no finish time)."""
    if record.finished_at is None or record.status not in (RunStatus.COMPLETED, RunStatus.FAILED):
        return None
    return max((record.finished_at - record.claimed_at).total_seconds(), 0.0)


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile of ``values`` (None for none): a value that occurred."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(math.ceil(fraction * len(ordered)), 1)
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class HandlerActivity:
    """One handler's last hour, from its run records.

    ``claimed[i]`` counts its runs by state whose latest claim fell in minute ``i`` of the
    window (0 the oldest); ``finished[i]`` those whose finish did.
    """

    handler: str
    kind: str
    claimed: list[Counter[str]]
    finished: list[int]
    runs: int
    states: Counter[str]
    p50: float | None
    p99: float | None
    timed: int  # How many runs the percentiles are over.
    # Whatever their claim time: dead letters the store keeps, runs stuck now.
    dead_letters: int = 0
    stuck: int = 0

    def counted(self, dead_letters: int, stuck: int) -> HandlerActivity:
        return dataclasses.replace(self, dead_letters=dead_letters, stuck=stuck)

    @property
    def peak(self) -> int:
        """The busiest minute's run count (at least 1, to scale a chart)."""
        return max([sum(c.values()) for c in self.claimed] + [*self.finished, 1])


@dataclass(frozen=True)
class Activity:
    """Every handler's last hour, those with stuck runs and dead letters first. ``start`` is
    the window's start; ``complete_since`` the oldest claim the summary could count from
    (``start`` unless the read was cut short: the minutes before it are incomplete)."""

    start: datetime
    now: datetime
    complete_since: datetime
    handlers: list[HandlerActivity] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        return self.complete_since > self.start

    @property
    def total(self) -> HandlerActivity:
        """All handlers as one."""
        return _merge("all handlers", "", self.handlers)


def window_start(now: datetime, window: timedelta = WINDOW, bucket: timedelta = BUCKET) -> datetime:
    """The window's first minute boundary: the last bucket holds ``now``."""
    epoch = datetime(2000, 1, 1, tzinfo=now.tzinfo)
    end = epoch + ((now - epoch) // bucket + 1) * bucket
    return end - window


def summarize(
    records: Iterable[RunRecord],
    now: datetime,
    *,
    window: timedelta = WINDOW,
    bucket: timedelta = BUCKET,
    oldest_read: datetime | None = None,
    dead_letters: Iterable[RunRecord] = (),
    stuck: Iterable[RunRecord] = (),
) -> Activity:
    """The last ``window`` of runs per handler, in ``bucket``-wide columns.

    ``oldest_read``: when the caller stopped reading at a limit, the claim time of the
    oldest record it read; runs claimed before it are missing from the summary.
    ``dead_letters`` and ``stuck``: failed runs and runs stuck at ``now``, of any age, counted
    per handler.
    """
    start = window_start(now, window, bucket)
    columns = window // bucket
    grouped: dict[tuple[str, str], list[RunRecord]] = {}
    for record in records:
        grouped.setdefault((record.handler, record.kind), []).append(record)
    dead = Counter((r.handler, r.kind) for r in dead_letters if r.status is RunStatus.FAILED)
    hung = Counter((r.handler, r.kind) for r in stuck if is_stuck(r, now))
    for key in (*dead, *hung):
        grouped.setdefault(key, [])
    handlers = [
        _handler(handler, kind, runs, now, start=start, bucket=bucket, columns=columns).counted(
            dead[(handler, kind)], hung[(handler, kind)]
        )
        for (handler, kind), runs in grouped.items()
    ]
    handlers.sort(key=lambda h: (-h.stuck, -h.dead_letters, -h.runs, h.handler))
    complete_since = max(start, oldest_read) if oldest_read is not None else start
    return Activity(start, now, complete_since, handlers)


def _handler(
    handler: str,
    kind: str,
    runs: list[RunRecord],
    now: datetime,
    *,
    start: datetime,
    bucket: timedelta,
    columns: int,
) -> HandlerActivity:
    claimed: list[Counter[str]] = [Counter() for _ in range(columns)]
    finished = [0] * columns
    states: Counter[str] = Counter()
    times: list[float] = []
    for record in runs:
        state = state_of(record, now)
        states[state] += 1
        column = _column(record.claimed_at, start, bucket, columns)
        if column is not None:
            claimed[column][state] += 1
        if record.finished_at is not None:
            done = _column(record.finished_at, start, bucket, columns)
            if done is not None:
                finished[done] += 1
        seconds = handler_seconds(record)
        if seconds is not None:
            times.append(seconds)
    return HandlerActivity(
        handler,
        kind,
        claimed,
        finished,
        len(runs),
        states,
        percentile(times, 0.5),
        percentile(times, 0.99),
        len(times),
    )


def _column(moment: datetime, start: datetime, bucket: timedelta, columns: int) -> int | None:
    if moment < start:
        return None
    index = (moment - start) // bucket
    return index if index < columns else None


def _merge(handler: str, kind: str, parts: list[HandlerActivity]) -> HandlerActivity:
    """Several handlers' columns added up; percentiles are not additive, so none."""
    columns = len(parts[0].claimed) if parts else 0
    claimed: list[Counter[str]] = [Counter() for _ in range(columns)]
    finished = [0] * columns
    states: Counter[str] = Counter()
    for part in parts:
        for index in range(columns):
            claimed[index].update(part.claimed[index])
            finished[index] += part.finished[index]
        states.update(part.states)
    runs = sum(part.runs for part in parts)
    merged = HandlerActivity(handler, kind, claimed, finished, runs, states, None, None, 0)
    return merged.counted(
        sum(part.dead_letters for part in parts), sum(part.stuck for part in parts)
    )
