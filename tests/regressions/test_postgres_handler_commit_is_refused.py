"""A transactional handler's writes on Postgres must be kept only with the run's completion
record. A handler that calls ``ctx.transaction.commit()`` (the psycopg habit) commits them on
its own: SQLite's store detects the ended transaction and refuses it, Postgres's does not, so
a takeover (or a crash) leaves the effect without the record and the retry applies it again."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tasklease.testing.contract_support import EXPIRED
from tasklease.worker import Router, create_app
from tasklease.worker.context import TaskContext
from tasklease.worker.core.records import Verdict
from tasklease.worker.stores.postgres import PostgresStore
from tests.helpers import FakeClock, claim_request, task_headers

pytestmark = pytest.mark.service


def _balance(store: PostgresStore) -> int:
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        row = connection.execute(
            f'SELECT balance FROM "{store.options.schema}".accounts'
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_handler_that_commits_itself_is_refused_and_keeps_nothing_when_taken_over(
    postgres_url: str,
) -> None:
    url = f"{postgres_url}&server_clock=off"  # The test's clock decides the leases.
    store = PostgresStore.from_url(url)
    store.get("warm-up")
    schema = store.options.schema
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{schema}".accounts (id text, balance integer)')
        connection.execute(f"INSERT INTO \"{schema}\".accounts VALUES ('a', 0)")
    other = PostgresStore.from_url(url)  # Another instance, after this one's lease lapsed.
    clock = FakeClock()
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        tx = ctx.transaction
        tx.execute(f'UPDATE "{schema}".accounts SET balance = balance + 1')
        tx.commit()  # psycopg habit; the README says never to, SQLite's store refuses it.
        later = clock() + (ctx.lease_expires - clock()) + EXPIRED
        taken = other.claim(claim_request(run_id=ctx.run_id, attempt_id="usurper"), later)
        assert taken.verdict is Verdict.CLAIMED

    app = create_app(router, store=store, auth="none", clock=clock)
    response = app.test_client().post("/tasks/charge", headers=task_headers(), data=b"{}")
    assert response.headers["X-Tasklease-Outcome"] == "lost_claim"
    assert _balance(store) == 0
    other.close()
    store.close()
