"""The SQLite store's delivery tally: one row per (instance, minute, handler, outcome).

The table is made by the first write (a read of a file that has none answers no counts, and
creates nothing): it is not part of the runs schema, so adding it needs no schema version.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

from tasklease.worker.stores.base.tally import (
    MinuteCounts,
    TallyKey,
    epoch_minute,
    from_epoch,
    merge,
)
from tasklease.worker.stores.sqlite.database import SqliteDatabase

SCHEMA = """CREATE TABLE IF NOT EXISTS delivery_tally (
    instance TEXT NOT NULL,
    minute INTEGER NOT NULL,
    kind TEXT NOT NULL,
    handler TEXT NOT NULL,
    outcome TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (instance, minute, kind, handler, outcome)
) WITHOUT ROWID"""
_UPSERT = (
    "INSERT INTO delivery_tally (instance, minute, kind, handler, outcome, count) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (instance, minute, kind, handler, outcome) "
    "DO UPDATE SET count = excluded.count"
)
_READ = (
    "SELECT minute, kind, handler, outcome, SUM(count) FROM delivery_tally WHERE minute >= ? "
    "GROUP BY minute, kind, handler, outcome"
)


def write(connection: sqlite3.Connection, instance: str, counts: MinuteCounts) -> None:
    """Inside the caller's write transaction."""
    connection.execute(SCHEMA)
    connection.executemany(
        _UPSERT,
        [
            (instance, epoch_minute(minute), key.kind, key.handler, key.outcome, n)
            for minute, keyed in counts.items()
            for key, n in keyed.items()
        ],
    )


def read(connection: sqlite3.Connection, since: datetime) -> dict[datetime, Counter[TallyKey]]:
    answer: dict[datetime, Counter[TallyKey]] = {}
    try:
        rows = connection.execute(_READ, (epoch_minute(since),)).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return answer  # Nothing was ever written.
        raise
    for minute, kind, handler, outcome, n in rows:
        merge(answer, from_epoch(minute), TallyKey(kind, handler, outcome), int(n))
    return answer


def purge(connection: sqlite3.Connection, before: datetime) -> int:
    """Inside the caller's write transaction."""
    connection.execute(SCHEMA)
    cursor = connection.execute(
        "DELETE FROM delivery_tally WHERE minute < ?", (epoch_minute(before),)
    )
    return cursor.rowcount


_T = TypeVar("_T")


class SqliteTally:
    """The delivery tally of a :class:`~tasklease.worker.stores.sqlite.database.SqliteDatabase`
    (:class:`~tasklease.worker.stores.base.tally.DeliveryTally`'s three methods), each write
    in a transaction of its own."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._database = database

    def write(self, instance: str, counts: MinuteCounts) -> None:
        self._alone("write delivery counts", lambda c: write(c, instance, counts))

    def read(self, since: datetime) -> dict[datetime, Counter[TallyKey]]:
        with self._database.guard("read delivery counts"):
            return read(self._database.connection(), since)

    def purge(self, before: datetime) -> int:
        return self._alone("purge delivery counts", lambda c: purge(c, before))

    def _alone(self, action: str, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """``work`` in a write transaction of its own, never in a batch of deliveries' writes
        (whose commit a failure of it would roll back)."""
        with self._database.guard(action), self._database.writer():
            connection = self._database.connection()
            connection.execute("BEGIN IMMEDIATE")
            try:
                value = work(connection)
                connection.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise
        return value
