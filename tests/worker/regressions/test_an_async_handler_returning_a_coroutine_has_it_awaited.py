"""An ``async def`` handler that returns a coroutine instead of awaiting it (``return
send(payload)`` for ``return await send(payload)``): its result was the coroutine itself, so
the run became a dead letter ("Object of type coroutine is not JSON serializable") and the
work it returned never ran ("coroutine ... was never awaited"). A sync handler returning a
coroutine has it awaited; an async one's is awaited the same way, so the work runs once and
its result is the run's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import task_headers


@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "transactional"])
def test_the_coroutine_an_async_handler_returns_is_awaited_for_its_result(
    tmp_path: Path, transactional: bool
) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    sent: list[Any] = []
    router = Router()

    async def send(payload: Any) -> str:
        sent.append(payload)
        return "sent"

    @router.task("receipt", transactional=transactional)
    async def receipt(payload: Any, ctx: TaskContext) -> Any:
        return send(payload)

    client = create_app(router, store=store, auth="none").test_client()
    try:
        answer = client.post("/tasks/receipt", headers=task_headers(), json={"order": 42})
        (record,) = store.list_runs()
    finally:
        store.close()
    assert (answer.get_json().get("result"), record.status) == ("sent", RunStatus.COMPLETED)
    assert sent == [{"order": 42}]
