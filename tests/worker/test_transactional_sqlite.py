"""Transactional handlers on the SQLite store: the transaction contract, and a handler's
writes through ``ctx.transaction`` kept exactly when its run completes (the real app)."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease.errors import ConfigurationError, PermanentFailure, StoreUnavailable
from tasklease.testing.transaction_contract import TransactionContract
from tasklease.testing.transactional_step_contract import TransactionalStepContract
from tasklease.worker import Router, create_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.delivery.executor import Executor
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.runtime.clock import Timing
from tasklease.worker.stores.memory.store import MemoryStore
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import task_headers
from tests.support.stores import sqlite_store_with


def _effects_store(path: Path) -> SqliteStore:
    return sqlite_store_with(
        path,
        "CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS accounts (id TEXT, balance INTEGER)",
        "INSERT INTO accounts VALUES ('a', 0)",
    )


def _count(path: Path, key: str) -> int:
    with sqlite3.connect(path) as connection:
        return int(
            connection.execute("SELECT count(*) FROM effects WHERE key = ?", (key,)).fetchone()[0]
        )


class TestSqliteTransactions(TransactionContract, TransactionalStepContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[SqliteStore]:
        store = _effects_store(tmp_path / "runs.db")
        yield store
        store.close()

    @pytest.fixture
    def write_effect(self) -> Callable[[Any, str], None]:
        def write(tx: sqlite3.Connection, key: str) -> None:
            tx.execute("INSERT INTO effects VALUES (?)", (key,))

        return write

    @pytest.fixture
    def count_effects(self, tmp_path: Path) -> Callable[[str], int]:
        return lambda key: _count(tmp_path / "runs.db", key)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    store = _effects_store(tmp_path / "runs.db")
    yield store
    store.close()


def _balance(store: SqliteStore) -> int:
    with sqlite3.connect(store.path) as connection:
        return int(connection.execute("SELECT balance FROM accounts").fetchone()[0])


def _deliver(app: Any, name: str = "charge", retry: int = 0, task: str = "task-1") -> Any:
    return app.test_client().post(
        f"/tasks/{name}", headers=task_headers(task=task, retry=retry, execution=retry), data=b"{}"
    )


def test_a_transactional_handler_applies_its_update_once_however_often_delivered(
    store: SqliteStore,
) -> None:
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> dict[str, int]:
        ctx.transaction.execute("UPDATE accounts SET balance = balance + 1")
        return {"fencing_token": ctx.fencing_token}

    app = create_app(router, store=store, auth="none")
    first = _deliver(app)
    assert first.headers["X-Tasklease-Outcome"] == "processed"
    assert json.loads(first.data)["result"] == {"fencing_token": 1}
    for retry in (0, 1):
        assert _deliver(app, retry=retry).headers["X-Tasklease-Outcome"] == "duplicate"
    assert _balance(store) == 1


def test_a_handler_that_raises_is_rolled_back_and_released_for_a_retry(
    store: SqliteStore,
) -> None:
    router = Router()
    calls: list[int] = []

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute("UPDATE accounts SET balance = balance + 1")
        calls.append(ctx.attempt)
        if len(calls) == 1:
            raise RuntimeError("after the update")

    app = create_app(router, store=store, auth="none")
    assert _deliver(app).headers["X-Tasklease-Outcome"] == "released"
    assert _balance(store) == 0
    assert _deliver(app, retry=1).headers["X-Tasklease-Outcome"] == "processed"
    assert _balance(store) == 1
    assert calls == [1, 2]


def test_a_handler_whose_lease_ran_out_on_the_way_to_its_transaction_never_runs(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease held at the claim and ran out by the attempt's own clock before the
    transaction opened (a stall, a call held up on its way): the handler is not called, and
    the claim is given back for the next delivery."""
    router = Router()
    calls: list[str] = []

    @router.task("charge", transactional=True, lease=timedelta(seconds=30))
    def charge(payload: Any, ctx: TaskContext) -> None:
        calls.append(ctx.run_id)
        ctx.transaction.execute("UPDATE accounts SET balance = balance + 1")

    app = create_app(router, store=store, auth="none")
    executor: Executor = app.extensions["tasklease"]
    now = [0.0]
    executor.timing = Timing(lambda: now[0])
    complete_in_transaction = store.complete_in_transaction

    def held_up(*args: Any, **kwargs: Any) -> Any:
        now[0] += 31.0  # On its way, the lease ran out by the attempt's own clock.
        return complete_in_transaction(*args, **kwargs)

    monkeypatch.setattr(store, "complete_in_transaction", held_up)
    answer = _deliver(app)
    assert answer.headers["X-Tasklease-Outcome"] == "lost_claim"
    assert calls == []
    assert _balance(store) == 0
    record = store.get(store.list_runs()[0].run_id)
    assert record is not None and record.status is RunStatus.RELEASED


def test_a_permanent_failure_is_rolled_back_and_recorded_failed(store: SqliteStore) -> None:
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute("UPDATE accounts SET balance = balance + 1")
        raise PermanentFailure("card declined")

    app = create_app(router, store=store, auth="none")
    response = _deliver(app)
    assert response.headers["X-Tasklease-Outcome"] == "failed"
    assert _balance(store) == 0
    failed = store.list_runs(RunStatus.FAILED)
    assert [run.error for run in failed] == ["PermanentFailure: card declined"]


def test_a_handler_sql_error_rolls_back_and_releases_instead_of_a_503(
    store: SqliteStore,
) -> None:
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute("UPDATE accounts SET balance = balance + 1")
        ctx.transaction.execute("INSERT INTO no_such_table VALUES (1)")

    app = create_app(router, store=store, auth="none")
    response = _deliver(app)
    assert response.headers["X-Tasklease-Outcome"] == "released"
    assert "OperationalError" in store.list_runs()[0].error  # type: ignore[operator]
    assert _balance(store) == 0


def test_an_async_transactional_handler_and_a_scheduled_one_get_the_transaction(
    store: SqliteStore,
) -> None:
    router = Router()

    @router.task("charge", transactional=True)
    async def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute("UPDATE accounts SET balance = balance + 1")

    @router.scheduled("nightly", transactional=True)
    def nightly(ctx: TaskContext) -> None:
        ctx.transaction.execute("UPDATE accounts SET balance = balance + 10")

    app = create_app(router, store=store, auth="none")
    assert _deliver(app).headers["X-Tasklease-Outcome"] == "processed"
    headers = {
        "X-CloudScheduler": "true",
        "X-CloudScheduler-JobName": "nightly",
        "X-CloudScheduler-ScheduleTime": "2026-10-16T12:00:00Z",
    }
    job = app.test_client().post("/jobs/nightly", headers=headers)
    assert job.headers["X-Tasklease-Outcome"] == "processed"
    assert _balance(store) == 11


def test_the_delivery_log_line_counts_the_transaction_tries(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    router = Router()
    router.task("charge", transactional=True)(lambda payload, ctx: None)
    app = create_app(router, store=store, auth="none")
    with caplog.at_level(logging.INFO, logger="tasklease"):
        _deliver(app)
    lines = [getattr(r, "tasklease", {}) for r in caplog.records]
    assert any(fields.get("transaction_tries") == 1 for fields in lines)


def test_ctx_transaction_outside_a_transactional_handler_says_how_to_get_one(
    store: SqliteStore,
) -> None:
    router = Router()
    seen: list[str] = []

    @router.task("plain")
    def plain(payload: Any, ctx: TaskContext) -> None:
        with pytest.raises(RuntimeError, match=r"transactional=True") as raised:
            _ = ctx.transaction
        seen.append(str(raised.value))

    app = create_app(router, store=store, auth="none")
    assert _deliver(app, name="plain").headers["X-Tasklease-Outcome"] == "processed"
    assert len(seen) == 1


def test_a_transactional_handler_on_the_memory_store_is_refused_at_start() -> None:
    router = Router()
    router.task("charge", transactional=True)(lambda payload, ctx: None)
    with pytest.raises(ConfigurationError, match=r"transactional=True.*SqliteStore, PostgresStore"):
        create_app(router, store=MemoryStore(), auth="none")


def test_transactional_does_not_combine_with_a_lock_yet() -> None:
    router = Router()
    with pytest.raises(ConfigurationError, match="does not combine"):
        router.scheduled("nightly", transactional=True, exclusive=True)(lambda ctx: None)


def test_claims_of_other_threads_wait_for_a_running_transaction_without_deadlock(
    store: SqliteStore,
) -> None:
    router = Router()
    inside = threading.Event()
    go_on = threading.Event()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute("UPDATE accounts SET balance = balance + 1")
        inside.set()
        assert go_on.wait(10)

    router.task("plain")(lambda payload, ctx: None)
    app = create_app(router, store=store, auth="none")
    answers: dict[str, str] = {}

    def deliver(name: str, task: str) -> None:
        answers[name] = _deliver(app, name=name, task=task).headers["X-Tasklease-Outcome"]

    charging = threading.Thread(target=deliver, args=("charge", "task-1"))
    charging.start()
    assert inside.wait(10)
    other = threading.Thread(target=deliver, args=("plain", "task-2"))
    other.start()  # Its claim queues behind the transaction in this process.
    go_on.set()
    charging.join(20)
    other.join(20)
    assert answers == {"charge": "processed", "plain": "processed"}
    assert _balance(store) == 1


def test_a_store_write_from_inside_the_transaction_is_refused_not_a_deadlock(
    store: SqliteStore,
) -> None:
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        store.release(ctx.run_id, ctx.attempt_id, "from inside", lambda: ctx.lease_expires)

    app = create_app(router, store=store, auth="none")
    response = _deliver(app)
    assert response.headers["X-Tasklease-Outcome"] == "released"
    assert "would wait for itself" in (store.list_runs()[0].error or "")


class _AnswerLostStore(SqliteStore):
    """Commits, then reports the database unavailable: an answer lost after the commit."""

    def complete_in_transaction(self, *args: Any, **kwargs: Any) -> Any:
        super().complete_in_transaction(*args, **kwargs)
        raise StoreUnavailable("the answer to COMMIT was lost")


class _CommitFailsStore(SqliteStore):
    """The database fails inside the transaction, after the handler's writes."""

    def complete_in_transaction(
        self, run_id: str, attempt_id: str, work: Any, *a: Any, **k: Any
    ) -> Any:
        def failing(tx: Any) -> Any:
            work(tx)
            raise StoreUnavailable("disk I/O error at COMMIT")

        return super().complete_in_transaction(run_id, attempt_id, failing, *a, **k)


def _charging_router() -> Router:
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> dict[str, int]:
        ctx.transaction.execute("UPDATE accounts SET balance = balance + 1")
        return {"charged": 1}

    return router


def test_a_commit_whose_answer_was_lost_is_recognised_from_the_record(tmp_path: Path) -> None:
    _effects_store(tmp_path / "runs.db").close()
    store = _AnswerLostStore(tmp_path / "runs.db")
    app = create_app(_charging_router(), store=store, auth="none")
    response = _deliver(app)
    assert response.headers["X-Tasklease-Outcome"] == "processed"
    assert json.loads(response.data)["result"] == {"charged": 1}
    assert _deliver(app, retry=1).headers["X-Tasklease-Outcome"] == "duplicate"
    assert _balance(store) == 1
    store.close()


def test_a_failed_commit_gives_the_claim_back_and_a_retry_applies_the_effect_once(
    tmp_path: Path,
) -> None:
    _effects_store(tmp_path / "runs.db").close()
    store = _CommitFailsStore(tmp_path / "runs.db")
    app = create_app(_charging_router(), store=store, auth="none")
    response = _deliver(app)
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (503, "unavailable")
    assert _balance(store) == 0
    (record,) = store.list_runs()
    assert record.status is RunStatus.RELEASED  # Given back: the retry need not wait.
    healthy = create_app(_charging_router(), store=SqliteStore(store.path), auth="none")
    assert _deliver(healthy, retry=1).headers["X-Tasklease-Outcome"] == "processed"
    assert _balance(store) == 1
    store.close()


@pytest.mark.parametrize("use", ["step", "continue_later"])
def test_a_durable_step_in_a_transactional_handler_fails_the_run_and_keeps_nothing(
    store: SqliteStore, use: str
) -> None:
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute("UPDATE accounts SET balance = balance + 1")
        if use == "step":
            ctx.step("charge", lambda: 1)
        else:
            ctx.continue_later({"page": 2})

    app = create_app(router, store=store, auth="none")
    answer = _deliver(app)
    assert answer.headers["X-Tasklease-Outcome"] == "failed"
    record = store.get(answer.headers["X-Tasklease-Run-Id"])
    assert record is not None and record.status is RunStatus.FAILED
    assert "not available in a transactional=True handler" in (record.error or "")
    assert _balance(store) == 0
