from __future__ import annotations

import gc

import pytest

from tasklease.testing.fan_in_contract import FanInContract
from tasklease.testing.store_contract import (
    LockContract,
    OperationsContract,
    StoreContract,
    TallyContract,
)
from tasklease.worker.stores import MemoryStore
from tests.support.helpers import T0, claim_request


class TestMemoryStore(
    StoreContract, LockContract, FanInContract, OperationsContract, TallyContract
):
    @pytest.fixture
    def store(self) -> MemoryStore:
        return MemoryStore()


def test_stored_records_are_not_tracked_by_the_cycle_collector() -> None:
    # Thousands of tracked records would slow every collection, and so every request.
    store = MemoryStore()
    for index in range(100):
        store.claim(claim_request(f"run-{index}"), T0)
    for _ in range(3):  # Each pass untracks one more level of nested tuples.
        gc.collect()
    assert not any(gc.is_tracked(packed) for packed in store._records.values())
    assert store.get("run-7") == store.claim(claim_request("run-7", "again"), T0).record
