"""The clocks the worker reads and how it waits, and the types of those it can be given instead
(tests pass fake ones, the simulation virtual ones; the core's rules take the time as an
argument and never read it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = ["Clock", "Timing", "utc_now"]

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Timing:
    """The local monotonic clock an attempt measures its lease by, and the pause it takes
    before retrying a store write: the process's own, or a simulation's virtual ones."""

    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


REAL_TIMING = Timing()
