"""A transactional handler's writes on Postgres must be kept only with the run's completion
record. A handler that calls ``ctx.transaction.commit()`` (the psycopg habit), sends
``COMMIT``, turns autocommit on, or opens ``with conn.transaction():`` at its top level
(psycopg then commits: in pipeline mode libpq reads the connection as idle) would commit them
on its own, so a takeover (or a crash) leaves the effect without the record and the retry
applies it again. Each is refused before it reaches the server; savepoints keep working."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tasklease.testing.contract_support import EXPIRED
from tasklease.worker import Router, create_app
from tasklease.worker.core.records import Verdict
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support.helpers import FakeClock, claim_request, task_headers

pytestmark = pytest.mark.service

Add = Callable[[int], None]
Body = Callable[[Any, Add, Callable[[], None]], None]


def _balance(store: PostgresStore) -> int:
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        row = connection.execute(
            f'SELECT balance FROM "{store.options.schema}".accounts'
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def deliver(postgres_url: str) -> Iterator[Callable[[Body], tuple[str, int, str]]]:
    """Deliver one task whose handler runs ``body(tx, add, take_over)``: add(n) adds n to the
    balance through ``tx``, take_over() lets
    another instance claim the run, as after this attempt's lease lapsed. Answers the
    outcome, the balance kept and the run's error."""
    url = f"{postgres_url}&server_clock=off"  # The test's clock decides the leases.
    store = PostgresStore.from_url(url)
    store.get("warm-up")
    schema = store.options.schema
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{schema}".accounts (id text, balance integer)')
        connection.execute(f"INSERT INTO \"{schema}\".accounts VALUES ('a', 0)")
    other = PostgresStore.from_url(url)
    clock = FakeClock()

    def run(body: Body) -> tuple[str, int, str]:
        router = Router()

        @router.task("charge", transactional=True)
        def charge(payload: Any, ctx: TaskContext) -> None:
            def take_over() -> None:
                later = ctx.lease_expires + EXPIRED
                taken = other.claim(claim_request(run_id=ctx.run_id, attempt_id="usurper"), later)
                assert taken.verdict is Verdict.CLAIMED

            tx = ctx.transaction

            def add(amount: int) -> None:
                tx.execute(f'UPDATE "{schema}".accounts SET balance = balance + %s', (amount,))

            body(tx, add, take_over)

        app = create_app(router, store=store, auth="none", clock=clock)
        response = app.test_client().post("/tasks/charge", headers=task_headers(), data=b"{}")
        (record,) = store.list_runs()
        return response.headers["X-Tasklease-Outcome"], _balance(store), record.error or ""

    yield run
    other.close()
    store.close()


def test_a_handler_that_commits_itself_is_refused_and_keeps_nothing_when_taken_over(
    deliver: Callable[[Body], tuple[str, int, str]],
) -> None:
    refusals: list[str] = []

    def body(tx: Any, add: Add, take_over: Callable[[], None]) -> None:
        add(1)
        try:
            tx.commit()  # psycopg habit; the README says never to.
        except RuntimeError as exc:  # The handler swallows the refusal and goes on.
            refusals.append(str(exc))
        take_over()

    assert deliver(body)[:2] == ("lost_claim", 0)
    assert len(refusals) == 1 and "refuses commit()" in refusals[0]


def test_a_top_level_transaction_block_is_a_savepoint_and_keeps_nothing_when_taken_over(
    deliver: Callable[[Body], tuple[str, int, str]],
) -> None:
    def body(tx: Any, add: Add, take_over: Callable[[], None]) -> None:
        add(1)
        tx.execute("SELECT 1").fetchone()  # Now libpq reads the pipeline's connection idle.
        with tx.transaction():
            add(10)
        take_over()

    assert deliver(body)[:2] == ("lost_claim", 0)


_ENDINGS: dict[str, Callable[[Any], object]] = {
    "commit": lambda tx: tx.commit(),
    "rollback": lambda tx: tx.rollback(),
    "COMMIT": lambda tx: tx.execute("COMMIT"),
    "cursor-END": lambda tx: tx.cursor().execute(" /* done */ END"),
    "executemany-COMMIT": lambda tx: tx.cursor().executemany("COMMIT", [()]),
    "autocommit": lambda tx: setattr(tx, "autocommit", True),
    "set_autocommit": lambda tx: tx.set_autocommit(True),
    "with": lambda tx: tx.__enter__(),
}


@pytest.mark.parametrize("end", list(_ENDINGS.values()), ids=list(_ENDINGS))
def test_every_way_to_end_the_transaction_is_refused_and_nothing_is_kept(
    deliver: Callable[[Body], tuple[str, int, str]], end: Callable[[Any], object]
) -> None:
    def body(tx: Any, add: Add, take_over: Callable[[], None]) -> None:
        add(1)
        end(tx)

    outcome, balance, error = deliver(body)
    assert (outcome, balance) == ("released", 0)
    assert "refuses" in error


def test_nested_savepoints_keep_working(
    deliver: Callable[[Body], tuple[str, int, str]],
) -> None:
    def body(tx: Any, add: Add, take_over: Callable[[], None]) -> None:
        with tx.transaction():
            add(1)
            tx.execute("SELECT 1").fetchone()  # Read idle again, inside the savepoint.
            with contextlib.suppress(psycopg.errors.DivisionByZero), tx.transaction():
                add(10)
                tx.execute("SELECT 1 / 0").fetchone()
            with tx.transaction():
                add(100)
                raise psycopg.Rollback()

    assert deliver(body)[:2] == ("processed", 1)
