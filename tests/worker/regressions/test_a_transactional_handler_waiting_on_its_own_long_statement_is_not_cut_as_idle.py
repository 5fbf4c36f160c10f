"""Finding: the client-side bound on a pipelined Postgres handler transaction counts from the
moment the handler *sends* a statement, not from its answer. A statement the server is still
running is not idle, but once it has run longer than twice the call timeout the watchdog
shuts the connection down and the run is given back as "idle in its transaction", on every
retry. A handler may legitimately raise its own statement's limit (``SET LOCAL
statement_timeout``) for one heavy query; the documented bound is for a transaction *idle*
after its last statement (docs/guarantees.md), so the bound must start when the answer
arrives (or at least not while a statement is in flight). The deadline now runs only while no
call of the handler's waits for the server, whichever call waits: a fetch, a savepoint's
Sync, or a transactional step's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support.helpers import task_headers

pytestmark = pytest.mark.service


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    # The idle bound: 2 x (0.5 s + the client's 1 s margin) = 3 s.
    store = PostgresStore.from_url(f"{postgres_url}&statement_timeout=0.5")
    store.get("warm-up")
    yield store
    store.close()


def test_a_statement_running_past_the_idle_bound_completes_the_run(store: PostgresStore) -> None:
    router = Router()
    idle_bound = store.options.idle_in_transaction

    @router.task("report", transactional=True)
    def report(payload: Any, ctx: TaskContext) -> int:
        tx = ctx.transaction
        tx.execute(f"SET LOCAL statement_timeout = '{int(idle_bound * 10)}s'")
        # Busy on the server the whole time, never idle; answers after the bound.
        (value,) = tx.execute(f"SELECT pg_sleep({idle_bound + 1.5}), 7").fetchone()[1:]
        return int(value)

    app = create_app(router, store=store, auth="none")
    answer = app.test_client().post("/tasks/report", headers=task_headers(), data=b"{}")
    (record,) = store.list_runs()
    assert (answer.headers["X-Tasklease-Outcome"], record.status.value) == (
        "processed",
        "completed",
    ), record.error


def test_a_savepoint_waiting_on_a_long_statement_at_its_end_completes_the_run(
    store: PostgresStore,
) -> None:
    router = Router()
    idle_bound = store.options.idle_in_transaction
    accounts = f'"{store.options.schema}".ledger'
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {accounts} (n integer)")

    @router.task("report", transactional=True)
    def report(payload: Any, ctx: TaskContext) -> None:
        tx = ctx.transaction
        tx.execute(f"SET LOCAL statement_timeout = '{int(idle_bound * 10)}s'")
        with tx.transaction():
            # Never fetched: the savepoint's end waits for its answer (a Sync).
            tx.execute(f"INSERT INTO {accounts} SELECT 1 FROM pg_sleep({idle_bound + 1.5})")

    app = create_app(router, store=store, auth="none")
    answer = app.test_client().post("/tasks/report", headers=task_headers(), data=b"{}")
    (record,) = store.list_runs()
    assert (answer.headers["X-Tasklease-Outcome"], record.status.value) == (
        "processed",
        "completed",
    ), record.error
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        assert connection.execute(f"SELECT n FROM {accounts}").fetchall() == [(1,)]


def test_a_transactional_step_waiting_on_a_long_statement_completes_the_run(
    store: PostgresStore,
) -> None:
    router = Router()
    idle_bound = store.options.idle_in_transaction

    def heavy(tx: Any) -> int:
        tx.execute(f"SET LOCAL statement_timeout = '{int(idle_bound * 10)}s'")
        rows = list(tx.execute(f"SELECT 7 FROM pg_sleep({idle_bound + 1.5})"))
        return int(rows[0][0])

    @router.task("report")
    def report(payload: Any, ctx: TaskContext) -> int:
        return int(ctx.step("heavy", heavy, transactional=True))

    app = create_app(router, store=store, auth="none")
    answer = app.test_client().post("/tasks/report", headers=task_headers(), data=b"{}")
    (record,) = store.list_runs()
    assert (answer.headers["X-Tasklease-Outcome"], record.status.value) == (
        "processed",
        "completed",
    ), record.error
