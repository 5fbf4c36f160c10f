"""An ``async def`` handler used to be called without being awaited: its coroutine was the
"result", which is not JSON, so every delivery became a dead letter without the handler's body
ever running (and the queue stopped retrying)."""

from __future__ import annotations

import asyncio
from typing import Any

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores import MemoryStore
from tests.support.helpers import task_headers


def test_an_async_handler_runs_and_its_result_is_recorded() -> None:
    ran: list[int] = []
    router = Router()

    @router.task("send_receipt")
    async def send_receipt(payload: Any, ctx: TaskContext) -> dict[str, int]:
        await asyncio.sleep(0)
        ran.append(payload["order_id"])
        return {"receipt_for": payload["order_id"]}

    store = MemoryStore()
    app = create_app(router, store=store, auth="none")
    response = app.test_client().post(
        "/tasks/send_receipt", headers=task_headers(), json={"order_id": 42}
    )
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (200, "processed")
    assert response.json is not None and response.json["result"] == {"receipt_for": 42}
    assert ran == [42]
    record = store.get(response.headers["X-Tasklease-Run-Id"])
    assert record is not None and record.status is RunStatus.COMPLETED
