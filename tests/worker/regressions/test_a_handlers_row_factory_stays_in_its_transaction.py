"""A transactional handler's ``ctx.transaction`` is the store's own connection: the SQLite
store's one writing connection of the process, a pooled psycopg connection on Postgres.
Reading rows as dicts (``row_factory``: the sqlite3 docs' recipe, psycopg's ``dict_row``) is
what a handler does with any connection; set on ``ctx.transaction`` it must last for the
handler's transaction only. If it stays on the connection, the store reads its own rows in
the handler's format: the run's completion fails, and so does every later delivery the
connection serves, transactional or not, each left in progress until its lease runs out."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.base.store import LeaseStore
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support.helpers import task_headers
from tests.support.stores import sqlite_store_with


def _sqlite_dict_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


def _deliver_three(store: LeaseStore, row_factory: Any, balance: str) -> list[RunStatus]:
    """Two transactional runs that read a row as a dict, then a plain run: the statuses."""
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> int:
        ctx.transaction.row_factory = row_factory
        row = ctx.transaction.execute(f"SELECT balance FROM {balance}").fetchone()
        ctx.transaction.execute(f"UPDATE {balance} SET balance = balance + 1")
        return int(row["balance"])

    @router.task("plain")
    def plain(payload: Any, ctx: TaskContext) -> str:
        return "done"

    client = create_app(router, store=store, auth="none").test_client()
    for name, task in (("charge", "t-1"), ("charge", "t-2"), ("plain", "t-3")):
        client.post(f"/tasks/{name}", headers=task_headers(task=task), data=b"{}")
    return [record.status for record in store.list_runs()]


def test_a_row_factory_set_on_the_sqlite_transaction_lasts_for_that_transaction_only(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    store = sqlite_store_with(
        path,
        "CREATE TABLE accounts (id TEXT, balance INTEGER)",
        "INSERT INTO accounts VALUES ('a', 0)",
    )
    try:
        statuses = _deliver_three(store, _sqlite_dict_row, "accounts")
    finally:
        store.close()
    with sqlite3.connect(path) as connection:
        (balance,) = connection.execute("SELECT balance FROM accounts").fetchone()
    assert (statuses, balance) == ([RunStatus.COMPLETED] * 3, 2)


@pytest.mark.service
def test_a_row_factory_set_on_the_postgres_transaction_lasts_for_that_transaction_only(
    postgres_url: str,
) -> None:
    # One pooled connection, so every delivery after the first is served by the one the
    # handler changed.
    store = PostgresStore.from_url(f"{postgres_url}&min_size=1&max_size=1")
    store.get("warm-up")
    table = f'"{store.options.schema}".accounts'
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {table} (id text, balance integer)")
        connection.execute(f"INSERT INTO {table} VALUES ('a', 0)")
    try:
        statuses = _deliver_three(store, dict_row, table)
        with psycopg.connect(store._conninfo, autocommit=True) as connection:
            row = connection.execute(f"SELECT balance FROM {table}").fetchone()
    finally:
        store.close()
    assert (statuses, row) == ([RunStatus.COMPLETED] * 3, (2,))
