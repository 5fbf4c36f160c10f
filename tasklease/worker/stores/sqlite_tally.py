"""The SQLite store's delivery tally: one row per (instance, minute, handler, outcome).

The table is made by the first write (a read of a file that has none answers no counts, and
creates nothing): it is not part of the runs schema, so adding it needs no schema version.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from datetime import datetime

from tasklease.worker.stores.delivery_tally import (
    MinuteCounts,
    TallyKey,
    epoch_minute,
    from_epoch,
    merge,
)

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
