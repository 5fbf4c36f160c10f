"""The SQLite store's ``locks`` table: reading, writing, listing and purging lock rows.

Times are integer microseconds since the epoch, as in every column of the store. The table
itself is created with the store's schema (:mod:`tasklease.worker.stores.sqlite`).
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

from tasklease.worker.core import locking
from tasklease.worker.core.records import LockRecord

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_COLUMNS = (
    "name, holder_run_id, holder_attempt_id, fencing_token, started_at_us, lease_expires_us, "
    "safety_expires_us, next_start_at_us, released_at_us, lapses_at_us"
)
# Only these constant column lists are interpolated into SQL; every value is a parameter.
_SELECT = f"SELECT {_COLUMNS} FROM locks"  # noqa: S608
_UPSERT = (
    f"INSERT OR REPLACE INTO locks ({_COLUMNS}) "  # noqa: S608
    f"VALUES ({', '.join('?' * len(_COLUMNS.split(', ')))})"
)


def micros(moment: datetime) -> int:
    """``moment`` as integer microseconds since the epoch, exactly."""
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def moment(value: int | None) -> datetime | None:
    """The inverse of :func:`micros` (None stays None)."""
    return None if value is None else _EPOCH + timedelta(microseconds=value)


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
    return (
        lock.name,
        lock.holder_run_id,
        lock.holder_attempt_id,
        lock.fencing_token,
        micros(lock.started_at),
        micros(lock.lease_expires),
        micros(lock.safety_expires),
        micros(lock.next_start_at),
        None if lock.released_at is None else micros(lock.released_at),
        micros(locking.lapses_at(lock)),
    )


def _decode(row: tuple[Any, ...]) -> LockRecord:
    (name, run_id, attempt_id, token, started_at, lease_expires, safety_expires, next_start_at,
     released_at, _lapses_at) = row  # fmt: skip
    return LockRecord(
        name=name,
        holder_run_id=run_id,
        holder_attempt_id=attempt_id,
        fencing_token=token,
        started_at=_EPOCH + timedelta(microseconds=started_at),
        lease_expires=_EPOCH + timedelta(microseconds=lease_expires),
        safety_expires=_EPOCH + timedelta(microseconds=safety_expires),
        next_start_at=_EPOCH + timedelta(microseconds=next_start_at),
        released_at=moment(released_at),
    )
