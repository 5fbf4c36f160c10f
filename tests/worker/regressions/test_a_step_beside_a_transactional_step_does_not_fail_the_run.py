"""Finding: ``await asyncio.gather(ctx.astep("debit", debit, transactional=True), quote())``,
where ``quote`` awaits another (plain) ``ctx.astep``, ended the run ``failed`` (dead-lettered,
never retried) though no step failed, after the debit had committed. "Inside a transactional
step" was kept on the attempt, which every step of the handler shares, so the concurrent
step was refused as if it were nested in the debit's function, and it saw the debit's
transaction as ``ctx.transaction``. The same from a sync handler whose steps run on two
threads. That state belongs to the transactional step's own execution (its thread, and the
coroutine its function runs as): a step beside it runs and is recorded; a step inside its
function is still refused."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core import steps
from tasklease.worker.core.identity import DeliveryIdentity, Kind
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import task_headers

# Only a guard against a hang should the steps not overlap; no assertion depends on it.
HANG_GUARD_SECONDS = 10.0


def _store(path: Path) -> SqliteStore:
    store = SqliteStore(path)
    store.get("warm-up")
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE accounts (id TEXT, balance INTEGER)")
        connection.execute("INSERT INTO accounts VALUES ('a', 0)")
    return store


def _bump(tx: Any) -> None:
    tx.execute("UPDATE accounts SET balance = balance + 1")


def _balance(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        return int(connection.execute("SELECT balance FROM accounts").fetchone()[0])


def _post(app: Any, handler: str, retry: int = 0) -> Any:
    return app.test_client().post(
        f"/tasks/{handler}",
        headers=task_headers(task="t-1", retry=retry, execution=retry),
        data=b"{}",
    )


def _recorded_steps(store: SqliteStore, handler: str) -> dict[str, Any]:
    run_id = DeliveryIdentity(Kind.TASK, handler, queue="default", task_name="t-1").run_id
    record = store.get(run_id)
    assert record is not None and record.status is RunStatus.COMPLETED
    recorded = steps.steps_of(record)
    assert {step.attempt_id for step in recorded.values()} == {record.attempt_id}
    return {name: step.result for name, step in recorded.items()}


def test_gathered_asteps_beside_a_transactional_one_complete_the_run(tmp_path: Path) -> None:
    store = _store(tmp_path / "runs.db")
    router = Router()
    seen: dict[str, Any] = {}

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> list[int]:
        debit_inside = asyncio.Event()
        quote_ran = asyncio.Event()

        async def debit(tx: Any) -> int:
            seen["debit sees its transaction"] = ctx.transaction is tx
            debit_inside.set()
            # Held open until the other step has started and run its function.
            await asyncio.wait_for(quote_ran.wait(), HANG_GUARD_SECONDS)
            _bump(tx)
            return 5

        def price() -> int:
            try:
                seen["quote's transaction"] = ctx.transaction
            except RuntimeError as exc:
                seen["quote's transaction"] = str(exc)
            quote_ran.set()
            return 42

        async def quote() -> int:
            await debit_inside.wait()
            try:
                return int(await ctx.astep("quote", price))
            finally:
                quote_ran.set()  # Also when refused: the debit must not wait for nothing.

        debited, quoted = await asyncio.gather(
            ctx.astep("debit", debit, transactional=True), quote()
        )
        return [debited, quoted]

    app = create_app(router, store=store, auth="none")
    answer = _post(app, "h")
    assert answer.headers["X-Tasklease-Outcome"] == "processed", answer.get_data(as_text=True)
    assert json.loads(answer.data)["result"] == [5, 42]
    assert seen["debit sees its transaction"] is True
    assert "does not run in a transaction" in seen["quote's transaction"]
    assert _post(app, "h", retry=1).headers["X-Tasklease-Outcome"] == "duplicate"
    assert _recorded_steps(store, "h") == {"debit": 5, "quote": 42}
    assert _balance(store.path) == 1
    store.close()


def test_a_step_on_another_thread_beside_a_transactional_step_completes_the_run(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path / "runs.db")
    router = Router()

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> list[int]:
        debit_inside = threading.Event()
        quote_ran = threading.Event()

        def debit(tx: Any) -> int:
            debit_inside.set()
            quote_ran.wait(HANG_GUARD_SECONDS)  # Until the other thread's step has run.
            _bump(tx)
            return 5

        def price() -> int:
            quote_ran.set()
            return 42

        def quote() -> int:
            debit_inside.wait(HANG_GUARD_SECONDS)
            try:
                return int(ctx.step("quote", price))
            finally:
                quote_ran.set()

        with ThreadPoolExecutor(1) as pool:
            quoted = pool.submit(quote)
            debited = int(ctx.step("debit", debit, transactional=True))
            return [debited, quoted.result()]

    app = create_app(router, store=store, auth="none")
    answer = _post(app, "h")
    assert answer.headers["X-Tasklease-Outcome"] == "processed", answer.get_data(as_text=True)
    assert json.loads(answer.data)["result"] == [5, 42]
    assert _recorded_steps(store, "h") == {"debit": 5, "quote": 42}
    assert _balance(store.path) == 1
    store.close()


def test_an_astep_inside_an_async_transactional_steps_function_is_still_refused(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path / "runs.db")
    router = Router()

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> int:
        async def outer(tx: Any) -> int:
            _bump(tx)
            return int(await ctx.astep("inner", lambda: 1))

        return int(await ctx.astep("outer", outer, transactional=True))

    answer = _post(create_app(router, store=store, auth="none"), "h")
    assert answer.headers["X-Tasklease-Outcome"] == "failed"
    assert "nor inside a transactional step" in answer.get_data(as_text=True)
    assert _balance(store.path) == 0
    store.close()
