"""PostgresStore: the contract suites on a private PostgreSQL cluster, and what is its own
(round trips, the server's clock, a frozen and a restarted server, schema migration, purge)."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest

from tasklease.worker.stores.postgres import PostgresStore
from tests.operations_contract import OperationsContract
from tests.store_contract import CrossProcessContract, StoreContract

pytestmark = pytest.mark.service


class TestPostgresStore(StoreContract, OperationsContract, CrossProcessContract):
    @pytest.fixture
    def store(self, postgres_url: str) -> Iterator[PostgresStore]:
        # The contract passes its own clocks: they are honoured (server_clock off).
        store = PostgresStore.from_url(f"{postgres_url}&server_clock=off")
        yield store
        store.close()

    @pytest.fixture
    def store_factory(self, postgres_url: str) -> functools.partial[PostgresStore]:
        return functools.partial(PostgresStore.from_url, f"{postgres_url}&server_clock=off")
