"""The SQLite store's ``locks`` table: reading, writing, listing and purging lock rows.

Times are integer microseconds since the epoch, as in every column of the store. The table
itself is created with the store's schema (:mod:`tasklease.worker.stores.sqlite.store`).
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

from tasklease.worker.core import locking
from tasklease.worker.core.records import LockRecord, RunRecord
from tasklease.worker.stores.base.codec import Conversion, RecordCodec, fields_of

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros(moment: datetime) -> int:
    """``moment`` as integer microseconds since the epoch, exactly."""
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def moment(value: int | None) -> datetime | None:
    """The inverse of :func:`micros` (None stays None)."""
    return None if value is None else _EPOCH + timedelta(microseconds=value)


MICROS = Conversion(micros, lambda value: _EPOCH + timedelta(microseconds=value))
"""A time as integer microseconds, in a column named for its field with ``_us`` appended."""


def renamed_times(record_type: type[RunRecord] | type[LockRecord]) -> dict[str, str]:
    """The ``_us`` column name of each of ``record_type``'s time fields."""
    return {name: f"{name}_us" for name in fields_of(record_type, datetime)}


_CODEC = RecordCodec(LockRecord, time=MICROS, renames=renamed_times(LockRecord))
_COLUMNS = ", ".join((*_CODEC.names, "lapses_at_us"))
# Only these constant column lists are interpolated into SQL; every value is a parameter.
_SELECT = f"SELECT {_COLUMNS} FROM locks"  # noqa: S608
_UPSERT = (
    f"INSERT OR REPLACE INTO locks ({_COLUMNS}) "  # noqa: S608
    f"VALUES ({', '.join('?' * len(_COLUMNS.split(', ')))})"
)


def read(connection: sqlite3.Connection, name: str) -> LockRecord | None:
    row = connection.execute(f"{_SELECT} WHERE name = ?", (name,)).fetchone()
    return _decode(row) if row else None


def write(connection: sqlite3.Connection, lock: LockRecord) -> None:
    connection.execute(_UPSERT, _encode(lock))


def listed(connection: sqlite3.Connection, limit: int) -> list[LockRecord]:
    """Up to ``limit`` locks, latest start first (a scan: locks are few, and this is for
    operators)."""
    sql = f"{_SELECT} ORDER BY started_at_us DESC, name DESC LIMIT ?"
    return [_decode(row) for row in connection.execute(sql, (limit,)).fetchall()]


def purge(connection: sqlite3.Connection, now: datetime) -> int:
    """Delete the locks that decide nothing any more (their ``lapses_at`` has passed)."""
    return connection.execute("DELETE FROM locks WHERE lapses_at_us <= ?", (micros(now),)).rowcount


def _encode(lock: LockRecord) -> tuple[Any, ...]:
    return (*_CODEC.encode(lock), micros(locking.lapses_at(lock)))


def _decode(row: tuple[Any, ...]) -> LockRecord:
    return _CODEC.decode(row)  # The row's last column, lapses_at_us, is not a field.
