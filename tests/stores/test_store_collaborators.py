"""A store's capabilities are interfaces it inherits; how a backend implements them lives in
collaborators the store holds, which never reach back into the store."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tasklease.worker.stores import (
    DeliveryTally,
    LeaseStore,
    LockStore,
    MemoryStore,
    OperatorQueries,
    SpannerStore,
    SqliteStore,
    TransactionalStore,
)
from tasklease.worker.stores.base.fan_ins import FanInStore
from tasklease.worker.stores.base.tally import TallyKey, minute_of
from tasklease.worker.stores.memory.tally import TallyTable
from tasklease.worker.stores.spanner.fan_ins import SpannerFanIns
from tasklease.worker.stores.spanner.runs import SpannerRuns
from tasklease.worker.stores.spanner.tally import SpannerTally
from tasklease.worker.stores.spanner.transactions import SpannerTransactions
from tasklease.worker.stores.sqlite.tally import SqliteTally
from tasklease.worker.stores.sqlite.transactions import SqliteTransactions
from tests.test_architecture import imported_names, modules_of

COLLABORATORS = [
    SqliteTally,
    SqliteTransactions,
    SpannerRuns,
    SpannerFanIns,
    SpannerTally,
    SpannerTransactions,
    TallyTable,
]
CAPABILITIES = (
    LeaseStore,
    DeliveryTally,
    TransactionalStore,
    LockStore,
    FanInStore,
    OperatorQueries,
)


@pytest.mark.parametrize("backend", ["memory", "sqlite", "spanner"])
def test_no_part_of_a_backend_imports_its_store(backend: str) -> None:
    """Not even lazily or for types: a part given the whole store would call whatever of it
    it liked."""
    package = f"tasklease.worker.stores.{backend}"
    host = f"{package}.store"
    reaching = sorted(
        module
        for module, path in modules_of(package).items()
        if module != host and host in imported_names(module, path)
    )
    assert reaching == []


@pytest.mark.parametrize("collaborator", COLLABORATORS, ids=lambda c: c.__name__)
def test_a_collaborator_is_no_store_capability_mixed_in(collaborator: type) -> None:
    assert not issubclass(collaborator, CAPABILITIES)


def test_the_stores_still_are_every_capability_they_were() -> None:
    assert all(
        issubclass(SpannerStore, capability)
        for capability in (
            TransactionalStore,
            DeliveryTally,
            LockStore,
            FanInStore,
            OperatorQueries,
        )
    )
    assert all(
        issubclass(MemoryStore, capability)
        for capability in (DeliveryTally, LockStore, OperatorQueries)
    )
    assert all(
        issubclass(SqliteStore, capability)
        for capability in (TransactionalStore, DeliveryTally, LockStore, OperatorQueries)
    )


def test_a_spanner_store_holds_its_collaborators_before_it_connects() -> None:
    store = SpannerStore("projects/p/instances/i/databases/d", create_schema=False)
    assert isinstance(store.runs, SpannerRuns) and store.runs.table == store.table
    assert isinstance(store.fan_ins, SpannerFanIns) and store.fan_ins.table.startswith(store.table)
    assert isinstance(store.tally, SpannerTally)
    assert isinstance(store.transactions, SpannerTransactions)
    assert not store.transactions.is_open("an-attempt")
    store.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_counts_written_through_the_store_are_its_tallys(kind: str, tmp_path: Path) -> None:
    store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "runs.db")
    now = datetime(2026, 10, 16, 12, 0, 30, tzinfo=UTC)
    key = TallyKey("task", "charge", "processed")
    store.write_delivery_counts("instance-1", {now: {key: 3}})
    assert store.tally.read(now) == {minute_of(now): Counter({key: 3})}
    assert store.delivery_counts(now) == store.tally.read(now)
    assert store.purge_delivery_counts(now.replace(hour=13)) == 1
    assert store.tally.read(now) == {}
    if isinstance(store, SqliteStore):
        store.close()
