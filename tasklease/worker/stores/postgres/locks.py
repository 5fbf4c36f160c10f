"""The Postgres store's ``locks`` table: one lock's compare-and-set change, listing, purge.

A lock change reads the lock (and, when the rule needs it, its holder's run) and writes it
conditional on the ``version`` it read: of two concurrent changes one wins, the other reads
again and decides from what is there. The holder's run is read beside the lock, not in one
snapshot with it, which is enough for the reason the Firestore store gives: "this attempt
ended its run" never becomes false (attempt ids are single use).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, TypeVar

from psycopg import Connection

from tasklease.errors import StoreUnavailable
from tasklease.worker.core.records import LockRecord, RunRecord
from tasklease.worker.stores.base.store import LockChange
from tasklease.worker.stores.postgres.schema import (
    LOCK_COLUMNS,
    Statements,
    decode_lock,
    decode_run,
    encode_lock,
)

_T = TypeVar("_T")

MAX_ROUNDS = 16  # Compare-and-set rounds before a change reports contention.

At = Callable[[datetime], AbstractContextManager[None]]
"""Makes the store's clock read ``datetime`` (the server's time of the read) for a block."""


def change_lock(
    connection: Connection[Any],
    statements: Statements,
    name: str,
    change: LockChange[_T],
    at: At,
) -> _T:
    """Apply ``change`` to lock ``name`` by compare-and-set; return its value."""
    for _ in range(MAX_ROUNDS):
        row = connection.execute(statements.read_lock, (name,)).fetchone()
        assert row is not None  # The read returns one row, the lock's columns NULL if absent.
        version, read_at = row[len(LOCK_COLUMNS)], row[-1]
        lock = decode_lock(row) if version is not None else None

        def read_run(run_id: str) -> RunRecord | None:
            found = connection.execute(statements.select_run, (run_id,)).fetchone()
            return decode_run(found) if found else None

        with at(read_at):
            new_lock, value = change(lock, read_run)
        if new_lock is None:
            return value
        values = encode_lock(new_lock)
        if version is None:
            written = connection.execute(statements.insert_lock, values).fetchone()
        else:
            written = connection.execute(
                statements.update_lock, [*values[1:], name, version]
            ).fetchone()
        if written is not None:
            return value
    raise StoreUnavailable(f"lock {name}: too much contention to change it")


def get(connection: Connection[Any], statements: Statements, name: str) -> LockRecord | None:
    row = connection.execute(statements.get_lock, (name,)).fetchone()
    return decode_lock(row) if row else None


def listed(connection: Connection[Any], statements: Statements, limit: int) -> list[LockRecord]:
    """Up to ``limit`` locks, latest start first."""
    return [decode_lock(row) for row in connection.execute(statements.list_locks, (limit,))]


def purge_batches(
    run: Callable[[str, tuple[Any, ...]], int], statement: str, now: datetime, batch: int
) -> Iterator[int]:
    """Delete what ``statement`` selects in batches of ``batch`` rows, one statement (and
    transaction) each, so a large backlog never holds locks long; yield each batch's count."""
    while True:
        purged = run(statement, (now, now, batch))
        yield purged
        if purged < batch:
            return
