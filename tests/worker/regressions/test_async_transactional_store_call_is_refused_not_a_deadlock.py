"""A call to the store from inside an ``async def`` transactional handler must be refused
(RuntimeError, as for a sync handler), not deadlock: the coroutine runs on the handler loop's
thread, not on the thread that took the group commit's lead alone, so the guard never fires
and the write waits forever for the transaction it is part of (holding SQLite's write lock)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import task_headers


def test_a_store_write_from_an_async_transactional_handler_is_refused_not_a_deadlock(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    store.get("warm-up")
    with sqlite3.connect(store.path) as connection:
        connection.execute("CREATE TABLE effects (k TEXT)")
    router = Router()

    @router.task("charge", transactional=True)
    async def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute("INSERT INTO effects VALUES ('x')")
        store.release(ctx.run_id, ctx.attempt_id, "from inside", lambda: ctx.lease_expires)

    app = create_app(router, store=store, auth="none")
    answers: list[str] = []

    def deliver() -> None:
        reply = app.test_client().post("/tasks/charge", headers=task_headers(), data=b"{}")
        answers.append(reply.headers["X-Tasklease-Outcome"])

    thread = threading.Thread(target=deliver, daemon=True)
    thread.start()
    thread.join(8)
    assert not thread.is_alive(), "the delivery deadlocked inside its own transaction"
    assert answers == ["released"]
    (record,) = store.list_runs()
    assert "RuntimeError" in (record.error or "")
    with sqlite3.connect(store.path) as connection:  # Rolled back with the transaction.
        assert connection.execute("SELECT count(*) FROM effects").fetchone() == (0,)
    store.close()
