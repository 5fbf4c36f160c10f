"""Finding: ``enqueue(..., transaction=tx)`` read ``cursor.rowcount`` right after its insert
to say whether the entry was new (``EnqueueResult.staged``); on a psycopg connection in
pipeline mode (a transactional handler's ``ctx.transaction`` on the Postgres store, or the
caller's own ``conn.pipeline()``) the result has not arrived then, so a new entry came back
``staged=False``, the answer for a key staged before. The flag is read from the insert's own
``RETURNING`` row."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tasklease.outbox.ddl import statements
from tasklease.producer import EnqueueResult
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support.helpers import task_headers
from tests.support.outbox import producer


@pytest.fixture
def store(postgres_url: str) -> Any:
    store = PostgresStore.from_url(postgres_url)
    store.get("warm-up")
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        connection.execute(f'SET search_path TO "{store.options.schema}"')
        for statement in statements("postgresql"):
            connection.execute(statement)
    yield store
    store.close()


@pytest.mark.service
def test_a_transactional_handler_learns_which_of_its_entries_are_new(store: Any) -> None:
    results: list[EnqueueResult] = []
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute(f'SET LOCAL search_path TO "{store.options.schema}"')
        make = producer("http://127.0.0.1:9")
        for key in ("o1", "o1", "o2"):
            results.append(make.enqueue("send_receipt", {}, key=key, transaction=ctx.transaction))

    app = create_app(router, store=store, auth="none")
    answer = app.test_client().post("/tasks/charge", headers=task_headers(), data=b"{}")
    assert answer.headers["X-Tasklease-Outcome"] == "processed"
    assert [result.staged for result in results] == [True, False, True]


@pytest.mark.service
def test_a_callers_own_pipeline_learns_which_of_its_entries_are_new(store: Any) -> None:
    make = producer("http://127.0.0.1:9")
    with psycopg.connect(store._conninfo) as conn, conn.pipeline():
        conn.execute(f'SET search_path TO "{store.options.schema}"')
        staged = [
            make.enqueue("send_receipt", {}, key=key, transaction=conn).staged
            for key in ("p1", "p1")
        ]
        many = make.enqueue_many("send_receipt", [("p2", {}), ("p1", {})], transaction=conn)
    assert staged == [True, False]
    assert [result.staged for result in many] == [True, False]
