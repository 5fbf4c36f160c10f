"""The SQLite store's joins: the ``fan_ins`` and ``fan_in_entries`` tables.

A join is one row (its counts), and each counted child one entry row keyed by the join and
the child's key, so a child can never count twice. Both are written in the same transaction
as the child's run row (:meth:`SqliteStore._read_modify_write_member`). Times are integer
microseconds, as everywhere in the store.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime

from tasklease.worker.core.fan_in import ChildEntry, FanInRecord
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.sqlite.locks import micros, moment

__all__ = ["SCHEMA", "Rows", "entries", "get", "mark_then_enqueued", "of_parent", "purge"]

# Added with CREATE ... IF NOT EXISTS beside the runs table: an older tasklease ignores them.
SCHEMA = """
CREATE TABLE IF NOT EXISTS fan_ins (
    join_id TEXT PRIMARY KEY,
    parent_run_id TEXT NOT NULL,
    then_handler TEXT NOT NULL,
    expected INTEGER NOT NULL,
    completed INTEGER NOT NULL,
    failed INTEGER NOT NULL,
    created_at_us INTEGER NOT NULL,
    expire_at_us INTEGER NOT NULL,
    then_enqueued_at_us INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS fan_ins_by_parent ON fan_ins (parent_run_id, created_at_us);
CREATE INDEX IF NOT EXISTS fan_ins_by_expiry ON fan_ins (expire_at_us);
CREATE TABLE IF NOT EXISTS fan_in_entries (
    join_id TEXT NOT NULL,
    child_key TEXT NOT NULL,
    run_id TEXT NOT NULL,
    status TEXT NOT NULL,
    finished_at_us INTEGER NOT NULL,
    result TEXT,
    error TEXT,
    PRIMARY KEY (join_id, child_key)
) WITHOUT ROWID
"""

_JOIN_COLUMNS = (
    "join_id, parent_run_id, then_handler, expected, completed, failed, created_at_us, "
    "expire_at_us, then_enqueued_at_us"
)
_SELECT_JOIN = f"SELECT {_JOIN_COLUMNS} FROM fan_ins"  # noqa: S608 - constant columns.
_ENTRY_COLUMNS = "join_id, child_key, run_id, status, finished_at_us, result, error"


class Rows:
    """A join's rows inside one write transaction (:class:`~tasklease.worker.stores.base.
    fan_ins.JoinRows`)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    def join(self, join_id: str) -> FanInRecord | None:
        row = self.connection.execute(f"{_SELECT_JOIN} WHERE join_id = ?", (join_id,)).fetchone()
        return _join(row) if row else None

    def has_entry(self, join_id: str, key: str) -> bool:
        row = self.connection.execute(
            "SELECT 1 FROM fan_in_entries WHERE join_id = ? AND child_key = ?", (join_id, key)
        ).fetchone()
        return row is not None

    def add_entry(self, entry: ChildEntry) -> None:
        self.connection.execute(
            f"INSERT INTO fan_in_entries ({_ENTRY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
            (
                entry.join_id,
                entry.key,
                entry.run_id,
                entry.status.value,
                micros(entry.finished_at),
                entry.result_json,
                entry.error,
            ),
        )

    def put_join(self, join: FanInRecord) -> None:
        enqueued = join.then_enqueued_at
        self.connection.execute(
            f"INSERT OR REPLACE INTO fan_ins ({_JOIN_COLUMNS}) "  # noqa: S608
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                join.join_id,
                join.parent_run_id,
                join.then,
                join.expected,
                join.completed,
                join.failed,
                micros(join.created_at),
                micros(join.expire_at),
                None if enqueued is None else micros(enqueued),
            ),
        )


def get(connection: sqlite3.Connection, join_id: str) -> FanInRecord | None:
    return Rows(connection).join(join_id)


def entries(
    connection: sqlite3.Connection, join_id: str, after: str | None, limit: int
) -> list[ChildEntry]:
    rows = connection.execute(
        f"SELECT {_ENTRY_COLUMNS} FROM fan_in_entries "  # noqa: S608
        "WHERE join_id = ? AND child_key > ? ORDER BY child_key LIMIT ?",
        (join_id, after or "", limit),
    ).fetchall()
    return [
        ChildEntry(join, key, run_id, RunStatus(status), _time(finished), result, error)
        for join, key, run_id, status, finished, result, error in rows
    ]


def of_parent(connection: sqlite3.Connection, parent_run_id: str, limit: int) -> list[FanInRecord]:
    rows = connection.execute(
        f"{_SELECT_JOIN} WHERE parent_run_id = ? ORDER BY created_at_us DESC, join_id DESC LIMIT ?",
        (parent_run_id, limit),
    ).fetchall()
    return [_join(row) for row in rows]


def mark_then_enqueued(connection: sqlite3.Connection, join_id: str, now: datetime) -> None:
    connection.execute(
        "UPDATE fan_ins SET then_enqueued_at_us = ? "
        "WHERE join_id = ? AND then_enqueued_at_us IS NULL",
        (micros(now), join_id),
    )


def purge(connection: sqlite3.Connection, now: datetime) -> int:
    """Delete the joins past their expiry, and their entries; return how many joins."""
    expired = [
        row[0]
        for row in connection.execute(
            "SELECT join_id FROM fan_ins WHERE expire_at_us <= ?", (micros(now),)
        )
    ]
    for join_id in expired:
        connection.execute("DELETE FROM fan_in_entries WHERE join_id = ?", (join_id,))
        connection.execute("DELETE FROM fan_ins WHERE join_id = ?", (join_id,))
    return len(expired)


def _time(value: int) -> datetime:
    at = moment(value)
    assert at is not None
    return at


def _join(row: tuple[object, ...]) -> FanInRecord:
    join_id, parent, then, expected, completed, failed, created, expire, enqueued = row
    assert isinstance(created, int) and isinstance(expire, int)
    return FanInRecord(
        str(join_id),
        str(parent),
        str(then),
        int(str(expected)),
        _time(created),
        _time(expire),
        completed=int(str(completed)),
        failed=int(str(failed)),
        then_enqueued_at=moment(enqueued) if isinstance(enqueued, int) else None,
    )
