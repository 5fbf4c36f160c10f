from __future__ import annotations

import pytest

from tests.store_contract import StoreContract
from worker.stores import MemoryStore


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> MemoryStore:
        return MemoryStore()
