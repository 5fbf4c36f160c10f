"""The Postgres store's run rows on one connection: the three conditional writes the shared
claim (:mod:`tasklease.worker.stores.base.conditional_claims`) is built on.

Each is one statement, conditional on the row's ``version``: a first claim inserts or, when
the run exists, returns its row in the same statement (``INSERT ... ON CONFLICT DO
NOTHING``), so the claim's read costs no round trip of its own. Reads report the server's
time of the statement, which then decides (``server_clock``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from typing import Any

from psycopg import Connection

from tasklease.worker.core.records import RunRecord
from tasklease.worker.stores.base.conditional_claims import ConditionalWrites, Inserted, Versioned
from tasklease.worker.stores.postgres.group_commit import StatementBatcher, fetch
from tasklease.worker.stores.postgres.schema import (
    RUN_COLUMNS,
    Statements,
    decode_run,
    encode_run,
    encode_run_changes,
)

__all__ = ["VERSION_AT", "PostgresRows", "Timed", "conditional_write"]

VERSION_AT = len(RUN_COLUMNS)  # A read row: the record's columns, its version, the time.

Timed = Callable[[Connection[Any], str, Any, str], Any]
"""Runs a statement whose row ends with the server's time, measuring the clock offset; on a
run (its last argument), with other threads' statements (group commit)."""

At = Callable[[datetime], AbstractContextManager[None]]
"""Makes the store's clock read ``datetime`` (the server's time of a read) for a block."""


def conditional_write(
    statements: Statements, before: Versioned[int], record: RunRecord
) -> tuple[str, list[Any]]:
    """The statement (and its parameters) that writes ``record`` if its row is still at
    ``before``'s version and attempt, sending only the columns that differ; it returns the
    new version, or no row."""
    columns, values = encode_run_changes(before.record, record)
    params = [*values, record.run_id, before.version, before.record.attempt_id]
    return statements.update_columns(columns), params


class PostgresRows(ConditionalWrites[int]):
    """The run rows through ``connection``; ``finishes`` batches the finishes of this
    process's threads (group commit)."""

    def __init__(
        self,
        connection: Connection[Any],
        statements: Statements,
        *,
        timed: Timed,
        at: At,
        finishes: StatementBatcher,
    ) -> None:
        self.connection = connection
        self.statements = statements
        self._timed = timed
        self._at = at
        self._finishes = finishes

    def insert_if_absent(self, record: RunRecord) -> Inserted[int] | Versioned[int] | None:
        params = [*encode_run(record), record.run_id]
        row = self._timed(self.connection, self.statements.claim, params, record.run_id)
        if row is None:
            return None  # A first claim raced ours and committed after our snapshot.
        inserted, row = row[0], row[1:]
        if inserted:
            return Inserted(row[VERSION_AT])
        return Versioned(decode_run(row), row[VERSION_AT], row[-1])

    def read_versioned(self, run_id: str) -> Versioned[int] | None:
        found, _ = self.read(run_id)
        return found

    def read(self, run_id: str) -> tuple[Versioned[int] | None, datetime]:
        """The run's row (None if absent) and the server's time of the read."""
        row = self._timed(self.connection, self.statements.read_run, (run_id,), "")
        assert row is not None  # One row, its record's columns NULL if absent.
        version = row[VERSION_AT]
        return (None if version is None else Versioned(decode_run(row), version, row[-1])), row[-1]

    def insert(self, record: RunRecord) -> int | None:
        """Insert ``record`` if its run has no row: the new version, else None."""
        inserted = self.connection.execute(
            self.statements.insert_run, encode_run(record)
        ).fetchone()
        return None if inserted is None else int(inserted[0])

    def write_if_version(
        self, before: Versioned[int], record: RunRecord, *, finishing: bool = False
    ) -> int | None:
        """Write ``record`` if its row is still at ``before``'s version and attempt, sending
        only the columns that differ; with other threads' finishes when ``finishing``."""
        statement, params = conditional_write(self.statements, before, record)
        batches = self._finishes if finishing else None
        row = fetch(batches, self.connection, record.run_id, statement, params)[0]
        return None if row is None else int(row[0])

    def deciding(self, read: Versioned[int]) -> AbstractContextManager[None]:
        return nullcontext() if read.read_at is None else self._at(read.read_at)
