"""Listing runs for operators: the filters, the page, and its cursor. Pure: no I/O.

Every store lists runs newest claim first (``claimed_at``, then ``run_id``, both descending)
and applies what filters it can where the data is; :meth:`RunFilter.matches` is the
definition, and the store's base class applies it to whatever a backend returns.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from tasklease.worker.core import decisions
from tasklease.worker.core.records import RunRecord, RunStatus

MAX_PAGE = 500
# The longest duration a filter takes: "now" minus it never leaves datetime's range.
MAX_DURATION = timedelta(days=36500)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

Position = tuple[datetime, str]
"""Where a listing stands: the last run's ``(claimed_at, run_id)``."""


@dataclass(frozen=True)
class RunFilter:
    """Which runs to list. Every field left None matches every run.

    - ``older_than`` / ``newer_than``: claimed before / at or after this time.
    - ``manual``: True for manual Scheduler runs only, False for every other run.
    - ``stuck_at``: only in-progress runs whose lease has expired at this time (a crashed
      attempt: nothing renews it, and no delivery has taken it over yet).
    """

    status: RunStatus | None = None
    handler: str | None = None
    kind: str | None = None
    older_than: datetime | None = None
    newer_than: datetime | None = None
    manual: bool | None = None
    stuck_at: datetime | None = None

    def matches(self, record: RunRecord) -> bool:
        stuck = self.stuck_at
        return (
            (self.status is None or record.status is self.status)
            and (self.handler is None or record.handler == self.handler)
            and (self.kind is None or record.kind == self.kind)
            and (self.older_than is None or record.claimed_at < self.older_than)
            and (self.newer_than is None or record.claimed_at >= self.newer_than)
            and (self.manual is None or is_manual(record) == self.manual)
            and (stuck is None or is_stuck(record, stuck))
        )

    @property
    def status_to_scan(self) -> RunStatus | None:
        """The status a backend may filter on (stuck runs are in progress)."""
        return RunStatus.IN_PROGRESS if self.stuck_at is not None else self.status


@dataclass(frozen=True)
class RunPage:
    """One page of a listing; ``cursor`` fetches the next page (None: this is the last)."""

    runs: list[RunRecord] = field(default_factory=list)
    cursor: str | None = None


def is_manual(record: RunRecord) -> bool:
    """A manual Cloud Scheduler run (``gcloud scheduler jobs run``, Console "Force run")."""
    return record.identity.get("trigger") == "manual"


def is_stuck(record: RunRecord, now: datetime) -> bool:
    """In progress, but its holder's lease has expired: the attempt crashed or hangs."""
    return (
        record.status is RunStatus.IN_PROGRESS
        and decisions.is_live(record, now)
        and not decisions.lease_held(record, now)
    )


def position(record: RunRecord) -> Position:
    return (record.claimed_at, record.run_id)


def before(record: RunRecord, after: Position | None) -> bool:
    """Whether ``record`` comes after ``after`` in the listing's order (newest first)."""
    return after is None or position(record) < after


def encode_cursor(after: Position) -> str:
    """An opaque, URL-safe cursor for the listing after ``after``."""
    moment, run_id = after
    text = json.dumps([moment.isoformat(), run_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> Position | None:
    """The position a cursor stands for; ValueError for anything this module did not make."""
    if not cursor:
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        moment, run_id = json.loads(text)
        parsed = datetime.fromisoformat(moment)
        if parsed.tzinfo is None or not isinstance(run_id, str):
            raise ValueError("not a position")
        # Year 9999 with a negative offset is past datetime's range in UTC: OverflowError.
        return (parsed.astimezone(UTC), run_id)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"invalid cursor {cursor!r}") from exc


def parse_duration(text: str) -> timedelta:
    """``90s``, ``10m``, ``2h``, ``1d``, ``1w`` or combinations such as ``1h30m``, up to
    :data:`MAX_DURATION`."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not parts or "".join(number + unit for number, unit in parts) != compact:
        raise ValueError(f"invalid duration {text[:40]!r}: use e.g. 90s, 10m, 2h, 1d")
    seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if not seconds <= MAX_DURATION.total_seconds():  # Also inf, from a thousand-digit number.
        raise ValueError(f"invalid duration {text[:40]!r}: at most {MAX_DURATION.days}d")
    return timedelta(seconds=seconds)
