"""Finding: a Postgres transactional handler that stalled after a write held its transaction
and row locks with no limit. The documented bound (the server ends a transaction idle longer
than twice the call timeout, ``idle_in_transaction_session_timeout``) never applied: the
handler's transaction is pipelined with no Sync before its commit, so the server never sees
it idle. Other sessions queued behind the lock until the handler woke, and then it committed.
The store now bounds it itself: twice the call timeout after the handler's last statement,
its connection is cut, the server rolls the transaction back, and the run is given back for
a retry that completes it once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support.helpers import task_headers

pytestmark = pytest.mark.service

# Far past the bound (2 x (0.5 s + the client's 1 s margin) = 3 s): the handler waits this
# long only if no other session gets its row lock first.
STALL = 30.0
IDLE_CUT = "idle in its transaction for 3s, waiting for no answer from the server"


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore.from_url(f"{postgres_url}&statement_timeout=0.5")
    store.get("warm-up")
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{store.options.schema}".accounts (id text, n integer)')
        connection.execute(f"INSERT INTO \"{store.options.schema}\".accounts VALUES ('a', 0)")
    yield store
    store.close()


# A write whose answer the handler never fetches holds its lock just the same: it is idle
# from the moment the write was sent.
@pytest.mark.parametrize("fetched", [True, False], ids=["fetched", "never-fetched"])
def test_another_session_gets_the_row_lock_and_the_retry_applies_the_write_once(
    store: PostgresStore, fetched: bool
) -> None:
    accounts = f'"{store.options.schema}".accounts'
    locked, other_has_lock = threading.Event(), threading.Event()
    happened: list[str] = []
    router = Router()

    @router.task("credit", transactional=True)
    def credit(payload: Any, ctx: TaskContext) -> None:
        tx = ctx.transaction
        written = tx.execute(f"UPDATE {accounts} SET n = n + 1 WHERE id = 'a' RETURNING n")
        if fetched:
            written.fetchone()
        if locked.is_set():  # The retry: no stall.
            return
        locked.set()
        woken_by_the_other_session = other_has_lock.wait(STALL)
        happened.append(f"handler woke (by the other session: {woken_by_the_other_session})")

    app = create_app(router, store=store, auth="none")
    answers: list[str] = []

    def deliver(retry: int) -> None:
        answer = app.test_client().post(
            "/tasks/credit", headers=task_headers(retry=retry, execution=retry), data=b"{}"
        )
        answers.append(answer.headers["X-Tasklease-Outcome"])

    first = threading.Thread(target=deliver, args=(0,))
    first.start()
    assert locked.wait(STALL)
    with psycopg.connect(store._conninfo, autocommit=True) as other:
        other.execute("SET statement_timeout = 0")  # Waits for the handler's row lock, as
        # long as its transaction lasts.
        row = other.execute(f"SELECT n FROM {accounts} WHERE id = 'a' FOR UPDATE").fetchone()
        assert row is not None
        (seen,) = row
        happened.append(f"other session got the lock, n = {seen}")
        other_has_lock.set()
    first.join()

    assert happened == [
        "other session got the lock, n = 0",  # Rolled back: the stalled write was not kept.
        "handler woke (by the other session: True)",
    ]
    (record,) = store.list_runs()
    assert answers == ["unavailable"]
    assert record.status.value == "released"
    assert IDLE_CUT in (record.error or "")

    deliver(1)
    (record,) = store.list_runs()
    assert answers[1] == "processed" and record.status.value == "completed"
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        row = connection.execute(f"SELECT n FROM {accounts} WHERE id = 'a'").fetchone()
    assert row == (1,)


def test_a_stalled_transactional_step_gives_up_its_row_lock_too(store: PostgresStore) -> None:
    accounts = f'"{store.options.schema}".accounts'
    locked, other_has_lock = threading.Event(), threading.Event()
    happened: list[str] = []
    router = Router()

    def credit(tx: Any) -> None:
        tx.execute(f"UPDATE {accounts} SET n = n + 1 WHERE id = 'a' RETURNING n").fetchone()
        if locked.is_set():  # The retry: no stall.
            return
        locked.set()
        woken_by_the_other_session = other_has_lock.wait(STALL)
        happened.append(f"step woke (by the other session: {woken_by_the_other_session})")

    @router.task("pay")
    def pay(payload: Any, ctx: TaskContext) -> None:
        ctx.step("credit", credit, transactional=True)

    app = create_app(router, store=store, auth="none")
    answers: list[str] = []

    def deliver(retry: int) -> None:
        answer = app.test_client().post(
            "/tasks/pay", headers=task_headers(retry=retry, execution=retry), data=b"{}"
        )
        answers.append(answer.headers["X-Tasklease-Outcome"])

    first = threading.Thread(target=deliver, args=(0,))
    first.start()
    assert locked.wait(STALL)
    with psycopg.connect(store._conninfo, autocommit=True) as other:
        other.execute("SET statement_timeout = 0")
        row = other.execute(f"SELECT n FROM {accounts} WHERE id = 'a' FOR UPDATE").fetchone()
        assert row is not None
        (seen,) = row
        happened.append(f"other session got the lock, n = {seen}")
        other_has_lock.set()
    first.join()

    assert happened == [
        "other session got the lock, n = 0",
        "step woke (by the other session: True)",
    ]
    (record,) = store.list_runs()
    assert answers == ["released"]  # The handler raised the step's StoreUnavailable.
    assert IDLE_CUT in (record.error or "")
    deliver(1)
    (record,) = store.list_runs()
    assert answers[1] == "processed" and record.status.value == "completed"
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        row = connection.execute(f"SELECT n FROM {accounts} WHERE id = 'a'").fetchone()
    assert row == (1,)
