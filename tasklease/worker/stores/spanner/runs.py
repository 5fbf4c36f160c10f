"""The Spanner store's run rows: read in a snapshot or a read-write transaction, and written
with the commit timestamp (:mod:`.schema` holds their columns and codec)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.cloud import spanner

from tasklease.plumbing.spanner_calls import guard
from tasklease.worker.core.records import RunRecord
from tasklease.worker.stores.spanner import schema

__all__ = ["Database", "SpannerRuns", "key_set"]

Database = Callable[[], Any]
"""Gives this process's ``spanner.Database``, its schema ready (made on first use)."""


def key_set(*keys: list[str]) -> Any:
    return spanner.KeySet(keys=list(keys))  # type: ignore[no-untyped-call]


class SpannerRuns:
    """The rows of the runs table ``table`` in the database ``database`` gives."""

    def __init__(self, database: Database, table: str) -> None:
        self._database = database
        self.table = table

    def read(self, reader: Any, run_id: str) -> RunRecord | None:
        """One run's row read in ``reader``: a snapshot, or a read-write transaction."""
        rows = list(reader.read(self.table, schema.RUN_COLUMNS, key_set([run_id])))
        return schema.decode_run(rows[0]) if rows else None

    def get(self, run_id: str) -> RunRecord | None:
        """One run's row by a strong single-use read (one RPC); StoreUnavailable if the
        database fails."""
        database = self._database()
        with guard("read a run"), database.snapshot() as snapshot:
            return self.read(snapshot, run_id)

    def write(self, transaction: Any, record: RunRecord) -> None:
        """Buffer ``record``'s row in ``transaction`` (inserted, or replacing the row)."""
        transaction.insert_or_update(self.table, schema.WRITE_COLUMNS, [_row_of(record)])

    def insert(self, batch: Any, record: RunRecord) -> None:
        """Buffer ``record``'s row in ``batch`` as an insert, refused if the run has a row."""
        batch.insert(self.table, schema.WRITE_COLUMNS, [_row_of(record)])


def _row_of(record: RunRecord) -> list[Any]:
    return schema.encode_run(record, spanner.COMMIT_TIMESTAMP)
