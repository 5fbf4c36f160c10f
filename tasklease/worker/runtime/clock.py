"""The wall clock the worker reads, and the type of a clock it can be given instead (tests pass a
fake one; the core's rules take the time as an argument and never read it)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)
