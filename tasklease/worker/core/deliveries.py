"""Deliveries per minute by outcome, from a store's delivery tally: what the worker did with
each request, including what leaves no run record (duplicates, 409s, lost claims). Pure:
the counts and the window's start in."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from tasklease.worker.core.activity import BUCKET, WINDOW

# Stacking order, bottom first; every other outcome (unrecorded, key_busy, ...) is "other".
OUTCOMES: tuple[str, ...] = (
    "processed",
    "duplicate",
    "in_progress",
    "released",
    "failed",
    "lost_claim",
    "other",
)

# (minute, handler, outcome, count): one row of a store's tally.
TallyRow = tuple[datetime, str, str, int]


@dataclass(frozen=True)
class DeliveryMinutes:
    """One handler's (or all handlers') deliveries: ``columns[i]`` counts minute ``i`` of the
    window (0 the oldest) by outcome."""

    handler: str
    columns: list[Counter[str]]

    @property
    def total(self) -> Counter[str]:
        return sum(self.columns, Counter())

    @property
    def peak(self) -> int:
        """The busiest minute's count (at least 1, to scale a chart)."""
        return max([sum(column.values()) for column in self.columns] + [1])


def delivery_minutes(
    rows: Iterable[TallyRow],
    start: datetime,
    *,
    handler: str | None = None,
    window: timedelta = WINDOW,
    bucket: timedelta = BUCKET,
) -> DeliveryMinutes:
    """The window from ``start`` in ``bucket``-wide columns, of ``handler`` (None: all)."""
    columns: list[Counter[str]] = [Counter() for _ in range(int(window / bucket))]
    for minute, name, outcome, count in rows:
        if handler is not None and name != handler:
            continue
        index = int((minute - start) / bucket)
        if 0 <= index < len(columns):
            columns[index][outcome if outcome in OUTCOMES else "other"] += count
    return DeliveryMinutes(handler or "all handlers", columns)
