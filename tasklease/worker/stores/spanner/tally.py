"""The Spanner store's delivery tally: one row per (instance, minute, kind, handler, outcome)
in ``{table}_tally``, made with the store's other tables (:func:`ddl`)."""

from __future__ import annotations

from abc import abstractmethod
from collections import Counter
from datetime import datetime
from typing import Any

from google.cloud import spanner

from tasklease.plumbing.spanner_calls import guard, run_transaction
from tasklease.worker.stores.base.tally import (
    TALLY_KEPT,
    DeliveryTally,
    MinuteCounts,
    TallyKey,
    minute_of,
)

_P = spanner.param_types
_COLUMNS = ("instance", "minute", "kind", "handler", "outcome", "count")


def table_of(runs_table: str) -> str:
    return f"{runs_table}_tally"


def ddl(runs_table: str) -> str:
    """The tally's table. Its row deletion policy is a backstop (whole days only, in
    Spanner); ``purge_delivery_counts`` keeps it to ``TALLY_KEPT``."""
    days = max(1, TALLY_KEPT.days + (1 if TALLY_KEPT.seconds else 0))
    return f"""CREATE TABLE IF NOT EXISTS {table_of(runs_table)} (
            instance STRING(MAX) NOT NULL,
            minute TIMESTAMP NOT NULL,
            kind STRING(64) NOT NULL,
            handler STRING(MAX) NOT NULL,
            outcome STRING(64) NOT NULL,
            count INT64 NOT NULL
        ) PRIMARY KEY (instance, minute, kind, handler, outcome),
        ROW DELETION POLICY (OLDER_THAN(minute, INTERVAL {days} DAY))"""


class SpannerTally(DeliveryTally):
    """The tally's primitives for :class:`~tasklease.worker.stores.spanner.store.SpannerStore`."""

    table: str
    _timeout: float

    @property
    @abstractmethod
    def database(self) -> Any:
        """The store's database handle (its schema made)."""

    def write_delivery_counts(self, instance: str, counts: MinuteCounts) -> None:
        rows = [
            [instance, minute_of(minute), key.kind, key.handler, key.outcome, count]
            for minute, keys in counts.items()
            for key, count in keys.items()
        ]
        if not rows:
            return
        table = table_of(self.table)

        def write(transaction: Any) -> None:  # Totals replace totals: a retry counts once.
            transaction.insert_or_update(table, _COLUMNS, rows)

        with guard("write delivery counts"):
            run_transaction(self.database, write, self._timeout, "write delivery counts")

    def delivery_counts(self, since: datetime) -> dict[datetime, Counter[TallyKey]]:
        sql = (
            "SELECT minute, kind, handler, outcome, SUM(count) "  # noqa: S608 - constant name.
            f"FROM {table_of(self.table)} WHERE minute >= @since "
            "GROUP BY minute, kind, handler, outcome"
        )
        found: dict[datetime, Counter[TallyKey]] = {}
        with guard("read delivery counts"), self.database.snapshot() as snapshot:
            rows = snapshot.execute_sql(
                sql, params={"since": minute_of(since)}, param_types={"since": _P.TIMESTAMP}
            )
            for minute, kind, handler, outcome, count in rows:
                at = minute_of(minute)
                found.setdefault(at, Counter())[TallyKey(kind, handler, outcome)] += int(count)
        return found

    def purge_delivery_counts(self, before: datetime) -> int:
        sql = f"DELETE FROM {table_of(self.table)} WHERE minute < @before"  # noqa: S608
        with guard("purge delivery counts"):
            deleted: int = run_transaction(
                self.database,
                lambda transaction: transaction.execute_update(
                    sql, params={"before": minute_of(before)}, param_types={"before": _P.TIMESTAMP}
                ),
                self._timeout,
                "purge delivery counts",
            )
        return deleted
