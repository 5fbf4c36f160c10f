"""``ctx.transaction`` of a transactional handler on SQLite and Postgres is the driver's
connection wrapped (so that the handler cannot end it): the outbox must still take it as
``transaction=``, staging the entry in the transaction that commits with the run's record."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tasklease.outbox.ddl import statements
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores.postgres.store import PostgresStore
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import task_headers
from tests.support.outbox import producer, sqlite_app_db


def _deliver(store: Any, before: str | None = None) -> str:
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        if before is not None:
            ctx.transaction.execute(before)
        producer("http://127.0.0.1:9").enqueue(
            "send_receipt", {}, key="o1", transaction=ctx.transaction
        )

    app = create_app(router, store=store, auth="none")
    response = app.test_client().post("/tasks/charge", headers=task_headers(), data=b"{}")
    (record,) = store.list_runs()
    assert record.error is None
    return str(response.headers["X-Tasklease-Outcome"])


def test_a_sqlite_transactional_handler_stages_an_outbox_entry_with_its_record(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    store.get("warm-up")
    sqlite_app_db(path)
    assert _deliver(store) == "processed"
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT count(*) FROM tasklease_outbox").fetchone() == (1,)
    store.close()


@pytest.mark.service
def test_a_postgres_transactional_handler_stages_an_outbox_entry_with_its_record(
    postgres_url: str,
) -> None:
    store = PostgresStore.from_url(postgres_url)
    store.get("warm-up")
    schema = store.options.schema
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        connection.execute(f'SET search_path TO "{schema}"')
        for statement in statements("postgresql"):
            connection.execute(statement)
    assert _deliver(store, before=f'SET LOCAL search_path TO "{schema}"') == "processed"
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        count = connection.execute(f'SELECT count(*) FROM "{schema}".tasklease_outbox').fetchone()
    assert count == (1,)
    store.close()
