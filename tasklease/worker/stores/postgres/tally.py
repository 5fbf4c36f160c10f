"""The Postgres store's delivery tally: one row per (instance, minute, handler, outcome) in
``{schema}.delivery_tally`` (made by the store's schema version 2)."""

from __future__ import annotations

from abc import abstractmethod
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, LiteralString, TypeVar

from psycopg import Connection, sql

from tasklease.worker.stores.base.tally import (
    DeliveryTally,
    MinuteCounts,
    TallyKey,
    merge,
    minute_of,
)

if TYPE_CHECKING:  # The options module imports the schema, which imports this one.
    from tasklease.worker.stores.postgres.options import Options

_T = TypeVar("_T")

TABLE: LiteralString = """CREATE TABLE IF NOT EXISTS {s}.delivery_tally (
    instance text NOT NULL,
    minute timestamptz NOT NULL,
    kind text NOT NULL,
    handler text NOT NULL,
    outcome text NOT NULL,
    count bigint NOT NULL,
    PRIMARY KEY (instance, minute, kind, handler, outcome)
)"""
INDEX: LiteralString = (
    "CREATE INDEX IF NOT EXISTS delivery_tally_by_minute ON {s}.delivery_tally (minute)"
)
_UPSERT: LiteralString = (
    "INSERT INTO {s}.delivery_tally (instance, minute, kind, handler, outcome, count) "
    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (instance, minute, kind, handler, outcome) "
    "DO UPDATE SET count = EXCLUDED.count"
)
_READ: LiteralString = (
    "SELECT minute, kind, handler, outcome, SUM(count) FROM {s}.delivery_tally "
    "WHERE minute >= %s GROUP BY minute, kind, handler, outcome"
)
_PURGE: LiteralString = "DELETE FROM {s}.delivery_tally WHERE minute < %s"


def _statement(text: LiteralString, schema: str) -> str:
    return sql.SQL(text).format(s=sql.Identifier(schema)).as_string(None)


def write(connection: Connection[Any], schema: str, instance: str, counts: MinuteCounts) -> None:
    rows = [
        (instance, minute_of(minute), key.kind, key.handler, key.outcome, n)
        for minute, keyed in counts.items()
        for key, n in keyed.items()
    ]
    with connection.transaction(), connection.cursor() as cursor:
        cursor.executemany(_statement(_UPSERT, schema), rows)


def read(
    connection: Connection[Any], schema: str, since: datetime
) -> dict[datetime, Counter[TallyKey]]:
    answer: dict[datetime, Counter[TallyKey]] = {}
    rows = connection.execute(_statement(_READ, schema), (minute_of(since),)).fetchall()
    for minute, kind, handler, outcome, n in rows:
        merge(answer, minute_of(minute), TallyKey(kind, handler, outcome), int(n))
    return answer


def purge(connection: Connection[Any], schema: str, before: datetime) -> int:
    return int(connection.execute(_statement(_PURGE, schema), (before,)).rowcount)


class PostgresTally(DeliveryTally):
    """The tally's primitives for :class:`~tasklease.worker.stores.postgres.store.PostgresStore`,
    through the store's own bounded calls."""

    options: Options

    @abstractmethod
    def _call(self, action: str, work: Callable[[Connection[Any]], _T]) -> _T:
        """Run ``work`` on a pooled connection, as the store does every statement."""

    def write_delivery_counts(self, instance: str, counts: MinuteCounts) -> None:
        schema = self.options.schema
        self._call("write delivery counts", lambda c: write(c, schema, instance, counts))

    def delivery_counts(self, since: datetime) -> dict[datetime, Counter[TallyKey]]:
        schema = self.options.schema
        return self._call("read delivery counts", lambda c: read(c, schema, since))

    def purge_delivery_counts(self, before: datetime) -> int:
        schema = self.options.schema
        return self._call("purge delivery counts", lambda c: purge(c, schema, before))
