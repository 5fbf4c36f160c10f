"""What a relay asks of an outbox, whatever holds it: claim, mark, report.

The SQL outboxes (:mod:`tasklease.outbox.db`), Firestore's
(:mod:`tasklease.outbox.firestore_db`) and Spanner's (:mod:`tasklease.outbox.spanner_db`)
each implement it; this module sits below all three, so none imports another's.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tasklease.outbox import wake
from tasklease.outbox.entries import Entry, Undecodable

__all__ = ["Failed", "OutboxDB", "Status"]


@dataclass(frozen=True)
class Failed:
    """An entry Cloud Tasks refused for good, and why."""

    id: str
    task_name: str
    attempts: int
    reason: str


@dataclass(frozen=True)
class Status:
    """``tasklease outbox status``: what waits, for how long, and what failed."""

    depth: int  # Pending entries.
    oldest_age: float  # Seconds since the oldest pending entry was staged (0: none).
    sent: int
    failed: list[Failed]
    retrying: int  # Pending entries that have failed at least once (backing off).
    failed_total: int = 0  # Failed entries, all of them (``failed`` lists the oldest).


class OutboxDB(ABC):
    """One relay's connection; not shared between threads."""

    dialect: str

    _woken: threading.Event | None = None

    @abstractmethod
    def close(self) -> None: ...

    def wait(self, timeout: float) -> bool:
        """Block until new entries may be there (at most ``timeout`` s); True when told so
        (an in-process commit, :mod:`tasklease.outbox.wake`)."""
        if self._woken is None:
            self._woken = wake.waiter()
        fired = self._woken.wait(timeout)
        self._woken.clear()
        return fired

    def _forget(self) -> None:
        if self._woken is not None:
            wake.forget(self._woken)

    @abstractmethod
    def migrate(self) -> None:
        """Create the outbox where it is missing (a no-op where it exists)."""

    @abstractmethod
    def has_outbox(self) -> bool:
        """Whether this database holds an outbox to relay."""

    @abstractmethod
    def claim(self, limit: int, now: float, lease: float) -> list[Entry | Undecodable]:
        """Up to ``limit`` due pending entries, oldest first, claimed until ``now + lease``;
        one that cannot be read back as an entry is marked failed in the same write (and
        returned as :class:`Undecodable`), never left to stall every later claim."""

    @abstractmethod
    def mark_sent(self, ids: Sequence[str], now: float) -> None:
        """Only for entries whose task Cloud Tasks created (or already had)."""

    @abstractmethod
    def mark_failed(self, failures: Mapping[str, str]) -> None:
        """Fail each entry id for good, with its reason (only entries still pending)."""

    @abstractmethod
    def retry_later(self, retries: Mapping[str, tuple[float, str]]) -> None:
        """Back off: each entry id -> (when to try again, the transient error)."""

    @abstractmethod
    def requeue_failed(self) -> int:
        """Failed entries back to pending (after fixing the cause, e.g. creating the queue)."""

    @abstractmethod
    def purge_sent(self, before: float, limit: int | None = None) -> int:
        """Delete sent entries older than ``before`` (at most ``limit`` when given)."""

    @abstractmethod
    def pending(self, now: float) -> tuple[int, float]:
        """(depth, oldest age in seconds) of the pending entries."""

    @abstractmethod
    def status(self, now: float, failed_limit: int = 50) -> Status:
        """What waits, for how long, and the oldest ``failed_limit`` failed entries."""
