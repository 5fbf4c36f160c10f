"""A PostgresStore that cannot connect says why (the server's own words: a database that does
not exist, a refused login), not only that the pool waited: psycopg_pool's timeout message
("couldn't get a connection after 2.00 sec") left the operator to guess."""

from __future__ import annotations

import pytest

from tasklease.errors import StoreUnavailable
from tasklease.worker.stores import PostgresStore
from tasklease.worker.stores.postgres.options import Options
from tests.support import postgres as postgres_support


def test_a_missing_database_is_named_in_the_store_error(
    postgres_cluster: postgres_support.Cluster,
) -> None:
    store = PostgresStore(postgres_cluster.url("no_such_database"), Options(pool_timeout=1.0))
    with pytest.raises(StoreUnavailable) as raised:
        store.get("run-1")
    assert 'database "no_such_database" does not exist' in str(raised.value)


def test_a_refused_login_is_named_in_the_store_error(
    postgres_cluster: postgres_support.Cluster,
) -> None:
    postgres_cluster.sql("DROP ROLE IF EXISTS nobody_may_login")
    postgres_cluster.sql("CREATE ROLE nobody_may_login NOLOGIN")
    url = postgres_cluster.url().replace("postgres@", "nobody_may_login@", 1)
    store = PostgresStore(url, Options(pool_timeout=1.0))
    with pytest.raises(StoreUnavailable) as raised:
        store.get("run-1")
    assert 'role "nobody_may_login" is not permitted to log in' in str(raised.value)
