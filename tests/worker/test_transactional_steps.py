"""Transactional durable steps (``ctx.step(..., transactional=True)``) through the real app,
on a real SQLite file and a private PostgreSQL cluster: a step's writes and its record
commit together, once."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tasklease.errors import LeaseLost, StoreUnavailable
from tasklease.testing.contract_support import EXPIRED, T0
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core import steps
from tasklease.worker.core.identity import DeliveryIdentity, Kind
from tasklease.worker.core.records import RunStatus
from tasklease.worker.core.steps import StepRecord
from tasklease.worker.handlers.attempt import Attempt
from tasklease.worker.handlers.steps import StepRunner
from tasklease.worker.runtime.clock import Timing
from tasklease.worker.stores.base.transactional import TRANSACTIONAL_STEP_STORES, TransactionalStore
from tasklease.worker.stores.memory.store import MemoryStore
from tasklease.worker.stores.postgres.store import PostgresStore
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import claim_request, task_headers


@dataclass
class Ledger:
    """A store with an ``accounts`` table beside its records, and the plain statement that
    adds 1 to a balance (no key: a second application shows)."""

    store: TransactionalStore
    bump: Callable[[Any], None]  # Through a transaction.
    balance: Callable[[], int]


def _sqlite(path: Path) -> Ledger:
    store = SqliteStore(path)
    store.get("warm-up")
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE accounts (id TEXT, balance INTEGER)")
        connection.execute("INSERT INTO accounts VALUES ('a', 0)")

    def balance() -> int:
        with sqlite3.connect(path) as connection:
            return int(connection.execute("SELECT balance FROM accounts").fetchone()[0])

    return Ledger(
        store, lambda tx: tx.execute("UPDATE accounts SET balance = balance + 1"), balance
    )


def _postgres(url: str) -> Ledger:
    store = PostgresStore.from_url(url)
    store.get("warm-up")
    schema = f'"{store.options.schema}"'
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {schema}.accounts (id text, balance integer)")
        connection.execute(f"INSERT INTO {schema}.accounts VALUES ('a', 0)")

    def balance() -> int:
        with psycopg.connect(store._conninfo, autocommit=True) as connection:
            row = connection.execute(f"SELECT balance FROM {schema}.accounts").fetchone()
        assert row is not None
        return int(row[0])

    return Ledger(
        store, lambda tx: tx.execute(f"UPDATE {schema}.accounts SET balance = balance + 1"), balance
    )


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.service)])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    if request.param == "sqlite":
        made = _sqlite(tmp_path / "runs.db")
    else:
        made = _postgres(request.getfixturevalue("postgres_url"))
    yield made
    made.store.close()


def _post(app: Any, retry: int = 0) -> Any:
    return app.test_client().post(
        "/tasks/h", headers=task_headers(task="t-1", retry=retry, execution=retry), data=b"{}"
    )


def _run_id() -> str:
    return DeliveryIdentity(Kind.TASK, "h", queue="default", task_name="t-1").run_id


def test_a_steps_writes_and_its_record_commit_together_once(ledger: Ledger) -> None:
    router = Router()

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> list[int]:
        def debit(tx: Any, amount: int) -> int:
            assert tx is ctx.transaction  # The same transaction, either way.
            ledger.bump(tx)
            return amount

        first = ctx.step("debit", debit, 5, transactional=True)

        @ctx.step("credit", transactional=True)
        def credit(tx: Any) -> int:
            ledger.bump(tx)
            return 7

        return [first, credit]

    app = create_app(router, store=ledger.store, auth="none")
    answer = _post(app)
    assert answer.headers["X-Tasklease-Outcome"] == "processed"
    assert json.loads(answer.data)["result"] == [5, 7]
    assert _post(app, retry=1).headers["X-Tasklease-Outcome"] == "duplicate"
    assert ledger.balance() == 2
    record = ledger.store.get(_run_id())
    assert record is not None and record.status is RunStatus.COMPLETED
    recorded = steps.steps_of(record)
    assert {name: step.result for name, step in recorded.items()} == {"debit": 5, "credit": 7}
    assert {step.attempt_id for step in recorded.values()} == {record.attempt_id}


def test_a_raising_step_is_rolled_back_and_released_and_its_retry_runs_it_again(
    ledger: Ledger,
) -> None:
    router = Router()
    calls: list[int] = []

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> int:
        def debit(tx: Any) -> int:
            ledger.bump(tx)
            calls.append(ctx.attempt)
            if len(calls) == 1:
                raise RuntimeError("after the update")
            return 1

        result: int = ctx.step("debit", debit, transactional=True)
        return result

    app = create_app(router, store=ledger.store, auth="none")
    assert _post(app).headers["X-Tasklease-Outcome"] == "released"
    assert ledger.balance() == 0
    record = ledger.store.get(_run_id())
    assert record is not None and steps.steps_of(record) == {}
    assert _post(app, retry=1).headers["X-Tasklease-Outcome"] == "processed"
    assert ledger.balance() == 1
    assert calls == [1, 2]


def test_a_failing_statement_of_the_step_is_its_own_error_and_rolls_back(
    ledger: Ledger,
) -> None:
    router = Router()

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> int:
        def debit(tx: Any) -> int:
            ledger.bump(tx)
            tx.execute("UPDATE no_such_table SET x = 1")  # Unfetched: Postgres pipelines it.
            return 1

        result: int = ctx.step("debit", debit, transactional=True)
        return result

    app = create_app(router, store=ledger.store, auth="none")
    assert _post(app).headers["X-Tasklease-Outcome"] == "released"  # Not a store outage.
    record = ledger.store.get(_run_id())
    assert record is not None and record.error is not None
    assert "no_such_table" in record.error
    assert ledger.balance() == 0


def test_a_replayed_step_returns_its_recorded_result_without_calling_its_function(
    ledger: Ledger,
) -> None:
    router = Router()
    calls: list[int] = []

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> dict[str, int]:
        def debit(tx: Any) -> dict[str, int]:
            ledger.bump(tx)
            calls.append(ctx.attempt)
            return {"attempt": ctx.attempt}

        result: dict[str, int] = ctx.step("debit", debit, transactional=True)
        if ctx.attempt == 1:
            raise RuntimeError("after the step's commit")
        return result

    app = create_app(router, store=ledger.store, auth="none")
    assert _post(app).headers["X-Tasklease-Outcome"] == "released"
    answer = _post(app, retry=1)
    assert answer.headers["X-Tasklease-Outcome"] == "processed"
    assert json.loads(answer.data)["result"] == {"attempt": 1}  # The first attempt's.
    assert calls == [1]
    assert ledger.balance() == 1


def test_a_stale_attempts_step_is_rolled_back_and_raises_lease_lost(ledger: Ledger) -> None:
    store = ledger.store
    store.claim(claim_request(), T0)
    store.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)  # A takeover.
    stale = Attempt("task", "h", "run-1", "attempt-1", T0 + timedelta(seconds=30))
    runner = StepRunner("run-1", stale, store, lambda: T0 + EXPIRED)
    calls: list[Any] = []

    def debit(tx: Any) -> int:
        ledger.bump(tx)
        calls.append(tx)
        return 1

    with pytest.raises(LeaseLost):
        runner.run("debit", debit, transactional=True)
    assert len(calls) == 1  # It ran, and what it wrote was rolled back.
    assert ledger.balance() == 0
    assert stale.lease_lost
    record = store.get("run-1")
    assert record is not None and steps.steps_of(record) == {}
    assert record.attempt_id == "attempt-2"


def test_a_step_whose_lease_ran_out_on_the_way_to_its_transaction_never_runs(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt's lease held when the step began, and ran out by its own clock before the
    step's transaction opened (a stall, a call held up on its way): ``fn`` is not called."""
    store = ledger.store
    store.claim(claim_request(), T0)
    now = [0.0]
    attempt = Attempt(
        "task", "h", "run-1", "attempt-1", T0 + timedelta(seconds=30), timing=Timing(lambda: now[0])
    )
    attempt.confirm_lease(T0 + timedelta(seconds=30), 30.0)
    record_step = store.record_step_in_transaction

    def held_up(*args: Any, **kwargs: Any) -> Any:
        now[0] += 31.0  # On its way, the lease ran out by the attempt's own clock.
        return record_step(*args, **kwargs)

    monkeypatch.setattr(store, "record_step_in_transaction", held_up)
    runner = StepRunner("run-1", attempt, store, None)
    calls: list[Any] = []

    def debit(tx: Any) -> int:
        ledger.bump(tx)
        calls.append(tx)
        return 1

    with pytest.raises(LeaseLost):
        runner.run("debit", debit, transactional=True)
    assert calls == []
    assert ledger.balance() == 0
    record = store.get("run-1")
    assert record is not None and steps.steps_of(record) == {}


def test_an_async_handlers_transactional_step_commits_with_its_record(tmp_path: Path) -> None:
    ledger = _sqlite(tmp_path / "runs.db")
    router = Router()

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> list[int]:
        async def debit(tx: Any) -> int:
            ledger.bump(tx)
            return 1

        def credit(tx: Any) -> int:
            ledger.bump(tx)
            return 2

        return [
            await ctx.astep("debit", debit, transactional=True),
            await ctx.astep("credit", credit, transactional=True),
        ]

    app = create_app(router, store=ledger.store, auth="none")
    answer = _post(app)
    assert answer.headers["X-Tasklease-Outcome"] == "processed"
    assert json.loads(answer.data)["result"] == [1, 2]
    assert ledger.balance() == 2
    ledger.store.close()


def test_a_transactional_step_is_refused_before_it_runs_on_a_store_without_it() -> None:
    router = Router()
    calls: list[Any] = []

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> Any:
        return ctx.step("debit", calls.append, transactional=True)

    answer = _post(create_app(router, store=MemoryStore(), auth="none"))
    assert answer.headers["X-Tasklease-Outcome"] == "failed"
    assert "transactional=True needs a store" in answer.get_data(as_text=True)
    assert calls == []


def test_a_step_inside_a_transactional_steps_function_is_refused(tmp_path: Path) -> None:
    ledger = _sqlite(tmp_path / "runs.db")
    router = Router()

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> Any:
        def outer(tx: Any) -> Any:
            ledger.bump(tx)
            return ctx.step("inner", lambda: 1)

        return ctx.step("outer", outer, transactional=True)

    answer = _post(create_app(router, store=ledger.store, auth="none"))
    assert answer.headers["X-Tasklease-Outcome"] == "failed"
    assert "nor inside a transactional step" in answer.get_data(as_text=True)
    assert ledger.balance() == 0
    ledger.store.close()


class LostAnswerStore(SqliteStore):
    """Its transactional step commits (or, ``commit=False``, runs and is rolled back), then
    the answer is lost: StoreUnavailable, as from a connection cut during COMMIT."""

    commit = True

    def record_step_in_transaction(
        self, run_id: str, attempt_id: str, step_work: Any, now: Any
    ) -> Any:
        def work(tx: Any) -> Any:
            step = step_work(tx)
            if not self.commit:
                raise _RolledBack
            return step

        with contextlib.suppress(_RolledBack):
            super().record_step_in_transaction(run_id, attempt_id, work, now)
        raise StoreUnavailable("the connection dropped during COMMIT")


class _RolledBack(Exception):
    pass


@pytest.mark.parametrize("committed", [True, False])
def test_a_step_whose_commit_answer_was_lost_is_decided_by_the_record(
    tmp_path: Path, committed: bool
) -> None:
    ledger = _sqlite(tmp_path / "runs.db")
    store = LostAnswerStore(tmp_path / "runs.db")
    store.commit = committed
    router = Router()
    calls: list[int] = []

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> int:
        def debit(tx: Any) -> int:
            ledger.bump(tx)
            calls.append(ctx.attempt)
            return 1

        result: int = ctx.step("debit", debit, transactional=True)
        return result

    app = create_app(router, store=store, auth="none")
    answer = _post(app)
    if committed:  # The record names this attempt's step: it landed, with its write.
        assert answer.headers["X-Tasklease-Outcome"] == "processed"
        assert ledger.balance() == 1
    else:  # Not recorded: it did not commit; the run goes back for a retry.
        assert answer.headers["X-Tasklease-Outcome"] != "processed"
        assert ledger.balance() == 0
        record = store.get(_run_id())
        assert record is not None and record.status is not RunStatus.COMPLETED
    assert calls == [1]
    store.close()
    ledger.store.close()


class CountingStore(SqliteStore):
    """Counts the store's atomic changes outside transactions, and its plain reads."""

    writes = 0
    reads = 0

    def _read_modify_write(self, run_id: str, change: Any) -> Any:
        self.writes += 1
        return super()._read_modify_write(run_id, change)

    def get(self, run_id: str) -> Any:
        self.reads += 1
        return super().get(run_id)


def test_a_transactional_step_costs_its_one_transaction_and_a_replay_costs_nothing(
    tmp_path: Path,
) -> None:
    ledger = _sqlite(tmp_path / "runs.db")
    store = CountingStore(tmp_path / "runs.db")
    router = Router()
    costs: list[tuple[int, int]] = []

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> int:
        before = (store.writes, store.reads)

        def debit(tx: Any) -> int:
            ledger.bump(tx)
            return 1

        result: int = ctx.step("debit", debit, transactional=True)
        costs.append((store.writes - before[0], store.reads - before[1]))
        if ctx.attempt == 1:
            raise RuntimeError("after the step")
        return result

    app = create_app(router, store=store, auth="none")
    assert _post(app).headers["X-Tasklease-Outcome"] == "released"
    assert _post(app, retry=1).headers["X-Tasklease-Outcome"] == "processed"
    # Run: no change besides its own transaction; replayed: no store call at all.
    assert costs == [(0, 0), (0, 0)]
    assert ledger.balance() == 1
    store.close()
    ledger.store.close()


class WithoutTransactionalSteps(SqliteStore):
    """A transactional store that has not implemented the step primitive (a third-party
    store's, say): the base class's default."""

    record_step_in_transaction = TransactionalStore.record_step_in_transaction


def test_a_transactional_step_is_refused_on_a_transactional_store_without_the_primitive(
    tmp_path: Path,
) -> None:
    ledger = _sqlite(tmp_path / "runs.db")
    store = WithoutTransactionalSteps(tmp_path / "runs.db")
    router = Router()
    calls: list[Any] = []

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> Any:
        return ctx.step("debit", calls.append, transactional=True)

    answer = _post(create_app(router, store=store, auth="none"))
    assert answer.headers["X-Tasklease-Outcome"] == "failed"
    assert TRANSACTIONAL_STEP_STORES in answer.get_data(as_text=True)
    assert calls == []

    def step_work(transaction: Any) -> StepRecord:
        raise AssertionError("the store refuses before any work")

    with pytest.raises(NotImplementedError):
        store.record_step_in_transaction("run-1", "attempt-1", step_work, T0)
    store.close()
    ledger.store.close()
