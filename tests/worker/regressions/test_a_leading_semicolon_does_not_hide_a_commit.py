"""``ctx.transaction`` refuses SQL that ends the transaction, judged by the statement's first
keyword after blanks and comments. An empty statement before it (``";COMMIT"``) hid the
``COMMIT`` from that check, and both SQLite and Postgres skip empty statements and commit:
the handler's writes were kept without the run's record, so the retry applied them again."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores.base.handler_transaction import ends_transaction
from tasklease.worker.stores.base.store import LeaseStore
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support.helpers import task_headers
from tests.support.stores import sqlite_store_with


@pytest.mark.parametrize("statement", [";COMMIT", " ; ;\n-- done\nEND", "/* */;ROLLBACK"])
def test_a_statement_ending_the_transaction_after_empty_ones_is_refused(statement: str) -> None:
    assert ends_transaction(statement)


def _charge_then_commit(store: LeaseStore, accounts: str) -> tuple[str, str]:
    """One delivery of a handler adding 1 to the balance then sending ``;COMMIT``: the
    outcome and the run's error."""
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute(f"UPDATE {accounts} SET balance = balance + 1")
        ctx.transaction.execute(";COMMIT")

    client = create_app(router, store=store, auth="none").test_client()
    response = client.post("/tasks/charge", headers=task_headers(), data=b"{}")
    (record,) = store.list_runs()
    return response.headers["X-Tasklease-Outcome"], record.error or ""


def test_sqlite_keeps_nothing_of_a_handler_that_sends_a_commit_after_a_semicolon(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    store = sqlite_store_with(
        path,
        "CREATE TABLE accounts (id TEXT, balance INTEGER)",
        "INSERT INTO accounts VALUES ('a', 0)",
    )
    try:
        outcome, error = _charge_then_commit(store, "accounts")
    finally:
        store.close()
    with sqlite3.connect(path) as connection:
        (balance,) = connection.execute("SELECT balance FROM accounts").fetchone()
    assert (outcome, balance) == ("released", 0)
    assert "refuses" in error


@pytest.mark.service
def test_postgres_keeps_nothing_of_a_handler_that_sends_a_commit_after_a_semicolon(
    postgres_url: str,
) -> None:
    store = PostgresStore.from_url(postgres_url)
    store.get("warm-up")
    accounts = f'"{store.options.schema}".accounts'
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {accounts} (id text, balance integer)")
        connection.execute(f"INSERT INTO {accounts} VALUES ('a', 0)")
    try:
        outcome, error = _charge_then_commit(store, accounts)
        with psycopg.connect(store._conninfo, autocommit=True) as connection:
            row = connection.execute(f"SELECT balance FROM {accounts}").fetchone()
    finally:
        store.close()
    assert (outcome, row) == ("released", (0,))
    assert "refuses" in error
