"""``ctx.transaction`` is the store's own connection, so a handler must not close it, as it
must not commit it. ``contextlib.closing(conn)`` is the sqlite3 idiom for a connection one
opened oneself; on SQLite, ``ctx.transaction.close()`` closed the process's one writing
connection: every later delivery of the process, of any handler, was answered 503 until the
process restarted, and the run stayed in progress. On Postgres it dropped a pooled
connection, and the handler's own mistake was answered as the store being unavailable.
Closing is refused like committing: the handler raised, the run is released."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.base.store import LeaseStore
from tasklease.worker.stores.postgres.store import PostgresStore
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import task_headers


def _close_then_deliver(store: LeaseStore) -> tuple[list[str], RunStatus, str]:
    """A transactional handler closes its connection, then a plain handler runs: the two
    answers' outcomes, and the first run's status and error."""
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        with contextlib.closing(ctx.transaction):
            pass

    @router.task("plain")
    def plain(payload: Any, ctx: TaskContext) -> str:
        return "done"

    client = create_app(router, store=store, auth="none").test_client()
    outcomes = [
        client.post(f"/tasks/{name}", headers=task_headers(task=name), data=b"{}").headers[
            "X-Tasklease-Outcome"
        ]
        for name in ("charge", "plain")
    ]
    (charged,) = [record for record in store.list_runs() if record.handler == "charge"]
    return outcomes, charged.status, charged.error or ""


def test_a_handler_cannot_close_the_sqlite_stores_connection(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    try:
        outcomes, status, error = _close_then_deliver(store)
    finally:
        store.close()
    assert (outcomes, status) == (["released", "processed"], RunStatus.RELEASED)
    assert "refuses close()" in error


@pytest.mark.service
def test_a_handler_cannot_close_its_pooled_postgres_connection(postgres_url: str) -> None:
    store = PostgresStore.from_url(f"{postgres_url}&min_size=1&max_size=1")
    try:
        outcomes, status, error = _close_then_deliver(store)
    finally:
        store.close()
    assert (outcomes, status) == (["released", "processed"], RunStatus.RELEASED)
    assert "refuses close()" in error
