"""Transactional handlers on PostgresStore (a private cluster): the transaction contract,
the round trips of a transactional first execution, and the real app."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg._pipeline_base import BasePipeline

from tasklease.testing.contract_support import EXPIRED
from tasklease.testing.transaction_contract import TransactionContract
from tasklease.testing.transactional_step_contract import TransactionalStepContract
from tasklease.worker import Router, create_app
from tasklease.worker.core.records import Verdict
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.stores.postgres.schema import Statements
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support.helpers import FakeClock, claim_request, task_headers

pytestmark = pytest.mark.service

_SETUP = Statements("x").now  # What the pool sends once per new connection.


def _with_tables(url: str) -> PostgresStore:
    store = PostgresStore.from_url(url)
    store.get("warm-up")  # Opens the pool and creates the store's schema.
    schema = store.options.schema
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{schema}".effects (key text NOT NULL)')
        connection.execute(f'CREATE TABLE "{schema}".accounts (id text, balance integer)')
        connection.execute(f"INSERT INTO \"{schema}\".accounts VALUES ('a', 0)")
    return store


def _scalar(store: PostgresStore, sql: str, *params: Any) -> int:
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        row = connection.execute(sql.format(s=f'"{store.options.schema}"'), params).fetchone()
    assert row is not None
    return int(row[0])


class TestPostgresTransactions(TransactionContract, TransactionalStepContract):
    @pytest.fixture
    def store(self, postgres_url: str) -> Iterator[PostgresStore]:
        store = _with_tables(f"{postgres_url}&server_clock=off")  # The contract's clocks.
        yield store
        store.close()

    @pytest.fixture
    def write_effect(self, store: PostgresStore) -> Callable[[Any, str], None]:
        schema = store.options.schema

        def write(tx: psycopg.Connection[Any], key: str) -> None:
            tx.execute(f'INSERT INTO "{schema}".effects VALUES (%s)', (key,))

        return write

    @pytest.fixture
    def count_effects(self, store: PostgresStore) -> Callable[[str], int]:
        return lambda key: _scalar(store, "SELECT count(*) FROM {s}.effects WHERE key = %s", key)


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    store = _with_tables(postgres_url)
    yield store
    store.close()


class RoundTrips:
    """Records what the store puts on the wire and waits for: each statement
    (``Connection.execute``; alone it is a round trip, in a pipeline it is queued), each
    pipeline Sync (psycopg sends one on ``Pipeline.sync()`` and another on leaving the
    ``pipeline()`` block, and waits for each) and each fetch in a pipeline whose result has
    not arrived (psycopg sends a Flush and waits)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[str] = []
        execute, sync = psycopg.Connection.execute, BasePipeline._enqueue_sync
        fetch = psycopg.Cursor._fetch_pipeline

        def counted_execute(connection: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if str(query) != _SETUP:
                word = str(query).split()[0].upper()
                self.sent.append(word if connection._pipeline is None else f"queued {word}")
            return execute(connection, query, *args, **kwargs)

        def counted_sync(pipeline: Any) -> None:
            self.sent.append("sync")
            sync(pipeline)

        def counted_fetch(cursor: Any) -> None:
            # The condition under which psycopg's Cursor._fetch_pipeline flushes and waits.
            pending = cursor._execmany_returning is not False and not cursor.pgresult
            if pending and cursor.connection._pipeline is not None:
                self.sent.append("flush")
            fetch(cursor)

        monkeypatch.setattr(psycopg.Connection, "execute", counted_execute)
        monkeypatch.setattr(BasePipeline, "_enqueue_sync", counted_sync)
        monkeypatch.setattr(psycopg.Cursor, "_fetch_pipeline", counted_fetch)

    def take(self) -> list[str]:
        taken, self.sent = self.sent, []
        return taken

    @staticmethod
    def waits(sent: list[str]) -> int:
        """Round trips: what is sent alone, each Sync, each Flush."""
        return sum(not entry.startswith("queued ") for entry in sent)


def test_a_transactional_first_execution_costs_two_framework_round_trips(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = store.options.schema
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute(f'UPDATE "{schema}".accounts SET balance = balance + 1')

    app = create_app(router, store=store, auth="none")
    trips = RoundTrips(monkeypatch)
    response = app.test_client().post("/tasks/charge", headers=task_headers(), data=b"{}")
    assert response.headers["X-Tasklease-Outcome"] == "processed"
    # The claim; then BEGIN, the handler's UPDATE, the conditional completion, COMMIT and
    # the session's RESET, queued and sent together: one wait for the server.
    sent = trips.take()
    assert sent == [
        "WITH",
        "queued BEGIN",
        "queued UPDATE",
        "queued WITH",
        "queued COMMIT",
        "queued RESET",
        "sync",
    ]
    assert RoundTrips.waits(sent) == 2
    retry = app.test_client().post(
        "/tasks/charge", headers=task_headers(retry=1, execution=1), data=b"{}"
    )
    assert retry.headers["X-Tasklease-Outcome"] == "duplicate"
    assert trips.take() == ["SELECT"]
    assert _scalar(store, "SELECT balance FROM {s}.accounts") == 1


def test_a_transactional_step_costs_two_framework_round_trips(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = store.options.schema
    router = Router()

    @router.task("charge")
    def charge(payload: Any, ctx: TaskContext) -> int:
        def debit(tx: psycopg.Connection[Any]) -> int:
            tx.execute(f'UPDATE "{schema}".accounts SET balance = balance + 1')
            return 1

        result: int = ctx.step("debit", debit, transactional=True)
        return result

    app = create_app(router, store=store, auth="none")
    trips = RoundTrips(monkeypatch)
    response = app.test_client().post("/tasks/charge", headers=task_headers(), data=b"{}")
    assert response.headers["X-Tasklease-Outcome"] == "processed"
    sent = trips.take()
    # The claim, the step, the run's completion; the step's transaction: BEGIN and the
    # step's UPDATE queued, the run's row read FOR UPDATE (one wait), then the record's
    # UPDATE, COMMIT and the session's RESET sent together (one more).
    assert sent[1:-1] == [
        "queued BEGIN",
        "queued UPDATE",
        "queued SELECT",
        "flush",
        "queued UPDATE",
        "queued COMMIT",
        "queued RESET",
        "sync",
    ], sent
    assert RoundTrips.waits(sent[1:-1]) == 2
    assert _scalar(store, "SELECT balance FROM {s}.accounts") == 1


def test_a_failing_unfetched_statement_of_the_handler_rolls_back_and_releases(
    store: PostgresStore,
) -> None:
    schema = store.options.schema
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute(f'UPDATE "{schema}".accounts SET balance = balance + 1')
        ctx.transaction.execute(f'INSERT INTO "{schema}".no_such_table VALUES (1)')

    app = create_app(router, store=store, auth="none")
    response = app.test_client().post("/tasks/charge", headers=task_headers(), data=b"{}")
    assert response.headers["X-Tasklease-Outcome"] == "released"
    assert "UndefinedTable" in (store.list_runs()[0].error or "")
    assert _scalar(store, "SELECT balance FROM {s}.accounts") == 0


def test_a_handler_dividing_by_zero_itself_is_not_taken_for_a_lost_claim(
    store: PostgresStore,
) -> None:
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute("SELECT 1 / (SELECT 0)")  # Unfetched: fails at the commit.

    app = create_app(router, store=store, auth="none")
    response = app.test_client().post("/tasks/charge", headers=task_headers(), data=b"{}")
    assert response.headers["X-Tasklease-Outcome"] == "released"
    assert "DivisionByZero" in (store.list_runs()[0].error or "")


def test_the_handler_can_read_what_it_wrote_in_its_transaction(store: PostgresStore) -> None:
    schema = store.options.schema
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> int:
        tx = ctx.transaction
        tx.execute(f'UPDATE "{schema}".accounts SET balance = balance + 5')
        row = tx.execute(f'SELECT balance FROM "{schema}".accounts').fetchone()
        return int(row[0])

    app = create_app(router, store=store, auth="none")
    response = app.test_client().post("/tasks/charge", headers=task_headers(), data=b"{}")
    assert response.headers["X-Tasklease-Outcome"] == "processed"
    assert response.json is not None
    assert response.json["result"] == 5


def test_a_connection_killed_before_the_commit_keeps_nothing_and_a_retry_applies_once(
    store: PostgresStore,
) -> None:
    schema = store.options.schema
    router = Router()
    kills: list[int] = []

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        tx = ctx.transaction
        tx.execute(f'UPDATE "{schema}".accounts SET balance = balance + 1')
        if not kills:  # The server ends this session before the commit (a crash, a failover).
            (pid,) = tx.execute("SELECT pg_backend_pid()").fetchone()
            kills.append(_scalar(store, "SELECT pg_terminate_backend(%s)::int", pid))

    app = create_app(router, store=store, auth="none")
    first = app.test_client().post("/tasks/charge", headers=task_headers(), data=b"{}")
    assert (first.status_code, first.headers["X-Tasklease-Outcome"]) == (503, "unavailable")
    assert kills == [1]
    assert _scalar(store, "SELECT balance FROM {s}.accounts") == 0
    retry = app.test_client().post(
        "/tasks/charge", headers=task_headers(retry=1, execution=1), data=b"{}"
    )
    assert retry.headers["X-Tasklease-Outcome"] == "processed"
    assert _scalar(store, "SELECT balance FROM {s}.accounts") == 1


def test_a_run_taken_over_while_its_handler_ran_keeps_nothing_it_wrote(
    postgres_url: str,
) -> None:
    url = f"{postgres_url}&server_clock=off"  # The test's clock decides the leases.
    store = _with_tables(url)
    other = PostgresStore.from_url(url)  # Another instance, after this one's lease lapsed.
    schema = store.options.schema
    clock = FakeClock()
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute(f'UPDATE "{schema}".accounts SET balance = balance + 1')
        later = clock() + (ctx.lease_expires - clock()) + EXPIRED
        taken = other.claim(claim_request(run_id=ctx.run_id, attempt_id="usurper"), later)
        assert taken.verdict is Verdict.CLAIMED

    app = create_app(router, store=store, auth="none", clock=clock)
    response = app.test_client().post("/tasks/charge", headers=task_headers(), data=b"{}")
    assert response.headers["X-Tasklease-Outcome"] == "lost_claim"
    assert _scalar(store, "SELECT balance FROM {s}.accounts") == 0
    record = store.get(store.list_runs()[0].run_id)
    assert record is not None and record.attempt_id == "usurper"
    other.close()
    store.close()
