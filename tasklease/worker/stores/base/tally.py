"""The delivery tally capability of a store: how many deliveries each handler had per minute,
by outcome, for the dashboard's chart of what leaves no run record (a duplicate answered from
the record, a 409 while another attempt holds the lease, a lost claim).

Each worker process counts its deliveries in memory and writes its counts at most once a
minute, in one write, from a background thread
(:mod:`tasklease.worker.observe.tally_flusher`): never on a delivery's path. A write carries
the process's *totals* for each minute it covers, keyed by the process's own ``instance``, and
replaces what that instance wrote for those minutes before: a write retried after an unknown
outcome cannot count twice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = ["TALLY_KEPT", "DeliveryTally", "MinuteCounts", "TallyKey", "minute_of"]

TALLY_KEPT = timedelta(hours=2)
"""How long counts are kept: ``purge_expired`` deletes older minutes."""


@dataclass(frozen=True, order=True)
class TallyKey:
    """What one count is of: a handler (``kind`` ``task`` or ``scheduler``) and an outcome
    (an :class:`~tasklease.worker.core.outcome.Outcome` value)."""

    kind: str
    handler: str
    outcome: str


MinuteCounts = Mapping[datetime, Mapping[TallyKey, int]]
"""Counts by minute (UTC, on the minute), then by :class:`TallyKey`."""


def minute_of(moment: datetime) -> datetime:
    """The UTC minute ``moment`` falls in."""
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def epoch_minute(minute: datetime) -> int:
    """A minute as whole seconds since the epoch (how the SQL stores keep it)."""
    return int(minute_of(minute).timestamp())


def from_epoch(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class DeliveryTally(ABC):
    """A store that keeps per-minute delivery counts (inherit it beside ``LeaseStore``).

    Implement :meth:`write_delivery_counts`, :meth:`delivery_counts` and
    :meth:`purge_delivery_counts`, and call the last from ``purge_expired`` with
    ``now - TALLY_KEPT``. Like every store method, each raises
    :class:`~tasklease.errors.StoreUnavailable` (and nothing else) when the backend fails.
    :mod:`tasklease.testing.tally_contract` holds the tests that prove an implementation.
    """

    @abstractmethod
    def write_delivery_counts(self, instance: str, counts: MinuteCounts) -> None:
        """In one write (one transaction, or one document or row per minute written
        atomically), set ``instance``'s totals for each minute and key in ``counts``,
        replacing what ``instance`` wrote for them before; other instances' are untouched."""

    @abstractmethod
    def delivery_counts(self, since: datetime) -> dict[datetime, Counter[TallyKey]]:
        """Every minute at or after ``minute_of(since)`` that has counts, summed over all
        instances."""

    @abstractmethod
    def purge_delivery_counts(self, before: datetime) -> int:
        """Delete the counts of minutes before ``before``; return how many rows (or
        documents) went."""


def merge(into: dict[datetime, Counter[TallyKey]], minute: datetime, key: TallyKey, n: int) -> None:
    """Add one stored count to a :meth:`DeliveryTally.delivery_counts` answer."""
    into.setdefault(minute, Counter())[key] += n
