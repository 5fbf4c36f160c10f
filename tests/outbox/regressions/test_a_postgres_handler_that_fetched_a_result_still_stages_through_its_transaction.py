"""Finding: on the Postgres store, a transactional handler that ran ``INSERT ... RETURNING id``
and fetched the row, then called ``enqueue(..., transaction=ctx.transaction)``, got
``NotInTransaction`` on every delivery: the run answered ``released`` forever. The store's
pooled connection is in autocommit mode and the handler's transaction is pipelined without a
Sync, so once every result had arrived libpq reported the connection idle, and the outbox
took that for "outside a transaction". The outbox trusts the framework's own transaction
object, and on a caller's own connection does not read libpq's status inside a pipeline."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tasklease.outbox import NotInTransaction
from tasklease.outbox.ddl import statements
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support.helpers import task_headers
from tests.support.outbox import producer

pytestmark = pytest.mark.service


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    """The store, with the outbox and an ``orders`` table in its schema."""
    store = PostgresStore.from_url(postgres_url)
    store.get("warm-up")
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        connection.execute(f'SET search_path TO "{store.options.schema}"')
        for statement in statements("postgresql"):
            connection.execute(statement)
        connection.execute("CREATE TABLE orders (id serial PRIMARY KEY, note text)")
    yield store
    store.close()


def _count(store: PostgresStore, table: str) -> int:
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        query = f'SELECT count(*) FROM "{store.options.schema}".{table}'
        row = connection.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def test_a_handler_that_fetched_its_insert_stages_its_entry_with_its_record(
    store: PostgresStore,
) -> None:
    router = Router()
    schema = store.options.schema

    @router.task("place_order", transactional=True)
    def place_order(payload: Any, ctx: TaskContext) -> int:
        tx = ctx.transaction
        tx.execute(f'SET LOCAL search_path TO "{schema}"')
        row = tx.execute("INSERT INTO orders (note) VALUES ('x') RETURNING id").fetchone()
        producer("http://127.0.0.1:9").enqueue(
            "send_receipt", {"order": row[0]}, key=f"order-{row[0]}", transaction=tx
        )
        return int(row[0])

    app = create_app(router, store=store, auth="none")
    answer = app.test_client().post("/tasks/place_order", headers=task_headers(), data=b"{}")
    (record,) = store.list_runs()
    assert (answer.headers["X-Tasklease-Outcome"], record.error) == ("processed", None)
    assert (_count(store, "orders"), _count(store, "tasklease_outbox")) == (1, 1)


def test_a_handlers_transaction_kept_past_its_handler_is_refused(store: PostgresStore) -> None:
    router = Router()
    kept: list[Any] = []

    @router.task("remember", transactional=True)
    def remember(payload: Any, ctx: TaskContext) -> None:
        kept.append(ctx.transaction)

    app = create_app(router, store=store, auth="none")
    app.test_client().post("/tasks/remember", headers=task_headers(), data=b"{}")
    with pytest.raises(NotInTransaction, match="stage entries from inside the handler"):
        producer("http://127.0.0.1:9").enqueue("send_receipt", {}, key="late", transaction=kept[0])
    assert _count(store, "tasklease_outbox") == 0


def test_a_callers_own_pipelined_transaction_stages_after_a_fetch(store: PostgresStore) -> None:
    make = producer("http://127.0.0.1:9")
    with psycopg.connect(store._conninfo, autocommit=True) as conn, conn.pipeline():
        conn.execute(f'SET search_path TO "{store.options.schema}"')
        conn.execute("BEGIN")
        row = conn.execute("INSERT INTO orders (note) VALUES ('y') RETURNING id").fetchone()
        assert row is not None
        make.enqueue("send_receipt", {}, key=f"order-{row[0]}", transaction=conn)
        conn.execute("ROLLBACK")  # The entry goes with the caller's transaction.
    assert (_count(store, "orders"), _count(store, "tasklease_outbox")) == (0, 0)


def test_a_callers_own_autocommit_pipeline_commits_the_entry_with_its_statements(
    store: PostgresStore,
) -> None:
    make = producer("http://127.0.0.1:9")
    with (
        pytest.raises(psycopg.errors.DivisionByZero),
        psycopg.connect(store._conninfo, autocommit=True) as conn,
        conn.pipeline(),
    ):
        conn.execute(f'SET search_path TO "{store.options.schema}"')
        conn.execute("INSERT INTO orders (note) VALUES ('z')")
        make.enqueue("send_receipt", {}, key="z", transaction=conn)
        conn.execute("SELECT 1 / 0")  # Up to the Sync, one transaction: none of it is kept.
    assert (_count(store, "orders"), _count(store, "tasklease_outbox")) == (0, 0)


def test_an_autocommit_connection_outside_a_pipeline_is_still_refused(
    store: PostgresStore,
) -> None:
    with (
        psycopg.connect(store._conninfo, autocommit=True) as conn,
        pytest.raises(NotInTransaction, match="autocommit mode"),
    ):
        producer("http://127.0.0.1:9").enqueue("send_receipt", {}, key="a", transaction=conn)
