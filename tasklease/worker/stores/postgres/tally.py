"""The Postgres store's delivery tally: one row per (instance, minute, handler, outcome) in
``{schema}.delivery_tally`` (made by the store's schema version 2)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any, LiteralString, Protocol, TypeVar

from psycopg import Connection, sql

from tasklease.worker.stores.base.tally import MinuteCounts, TallyKey, merge, minute_of

_T = TypeVar("_T")


class Call(Protocol):
    """Runs ``work`` on a pooled connection, bounded, as the store does every statement."""

    def __call__(self, action: str, work: Callable[[Connection[Any]], _T]) -> _T: ...


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


class PostgresTally:
    """The tally of the Postgres store in ``schema``, through the store's bounded ``call``."""

    def __init__(self, call: Call, schema: str) -> None:
        self._call = call
        self.schema = schema

    def write(self, instance: str, counts: MinuteCounts) -> None:
        """:meth:`DeliveryTally.write_delivery_counts`."""
        schema = self.schema
        self._call("write delivery counts", lambda c: write(c, schema, instance, counts))

    def read(self, since: datetime) -> dict[datetime, Counter[TallyKey]]:
        """:meth:`DeliveryTally.delivery_counts`."""
        schema = self.schema
        return self._call("read delivery counts", lambda c: read(c, schema, since))

    def purge(self, before: datetime) -> int:
        """:meth:`DeliveryTally.purge_delivery_counts`."""
        schema = self.schema
        return self._call("purge delivery counts", lambda c: purge(c, schema, before))
