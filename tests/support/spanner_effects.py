"""Shared by the Spanner handler tests: a store beside an ``effects`` table that handlers
write through their transaction, and the count of the rows kept there."""

from __future__ import annotations

from tasklease.worker.stores import SpannerStore

EFFECTS_DDL = "CREATE TABLE effects (id STRING(64) NOT NULL, key STRING(64)) PRIMARY KEY (id)"


def store_with_effects(database: str) -> SpannerStore:
    """A SpannerStore on ``database`` (5 s call timeout), the ``effects`` table created."""
    store = SpannerStore(database, call_timeout=5.0)
    store.database.update_ddl([EFFECTS_DDL]).result(60)
    return store


def effects(store: SpannerStore) -> int:
    """The rows in ``effects``, read outside any transaction."""
    with store.database.snapshot() as snapshot:
        return int(next(iter(snapshot.execute_sql("SELECT COUNT(*) FROM effects")))[0])
