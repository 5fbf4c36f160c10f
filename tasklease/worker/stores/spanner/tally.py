"""The Spanner store's delivery tally: one row per (instance, minute, kind, handler, outcome)
in ``{table}_tally``, made with the store's other tables (:func:`ddl`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

from google.cloud import spanner

from tasklease.plumbing.spanner_calls import guard, run_transaction
from tasklease.worker.stores.base.tally import (
    TALLY_KEPT,
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


class SpannerTally:
    """The delivery tally kept beside the runs table ``table``, in the ``spanner.Database``
    that ``database`` gives (this process's, its schema ready):
    :class:`~tasklease.worker.stores.base.tally.DeliveryTally`'s three methods, each call
    bounded by ``call_timeout`` seconds."""

    def __init__(self, database: Callable[[], Any], table: str, call_timeout: float) -> None:
        self._database = database
        self._table = table_of(table)
        self._timeout = call_timeout

    def write(self, instance: str, counts: MinuteCounts) -> None:
        rows = [
            [instance, minute_of(minute), key.kind, key.handler, key.outcome, count]
            for minute, keys in counts.items()
            for key, count in keys.items()
        ]
        if not rows:
            return
        table = self._table

        def write(transaction: Any) -> None:  # Totals replace totals: a retry counts once.
            transaction.insert_or_update(table, _COLUMNS, rows)

        with guard("write delivery counts"):
            run_transaction(self._database(), write, self._timeout, "write delivery counts")

    def read(self, since: datetime) -> dict[datetime, Counter[TallyKey]]:
        sql = (
            "SELECT minute, kind, handler, outcome, SUM(count) "  # noqa: S608 - constant name.
            f"FROM {self._table} WHERE minute >= @since "
            "GROUP BY minute, kind, handler, outcome"
        )
        found: dict[datetime, Counter[TallyKey]] = {}
        with guard("read delivery counts"), self._database().snapshot() as snapshot:
            rows = snapshot.execute_sql(
                sql, params={"since": minute_of(since)}, param_types={"since": _P.TIMESTAMP}
            )
            for minute, kind, handler, outcome, count in rows:
                at = minute_of(minute)
                found.setdefault(at, Counter())[TallyKey(kind, handler, outcome)] += int(count)
        return found

    def purge(self, before: datetime) -> int:
        sql = f"DELETE FROM {self._table} WHERE minute < @before"  # noqa: S608
        with guard("purge delivery counts"):
            deleted: int = run_transaction(
                self._database(),
                lambda transaction: transaction.execute_update(
                    sql, params={"before": minute_of(before)}, param_types={"before": _P.TIMESTAMP}
                ),
                self._timeout,
                "purge delivery counts",
            )
        return deleted
