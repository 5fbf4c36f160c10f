"""Finding: a handler result with keys of mixed types (``{1: "one", "total": 1}``) was
serialised with sorted keys, which Python cannot sort; the successful run was recorded as
failed, a dead letter an operator may replay, running its effects again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasklease.worker.core.records import RunStatus
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import FakeClock, task_headers


def test_a_result_with_int_and_str_keys_is_recorded_as_completed(
    tmp_path: Path, clock: FakeClock
) -> None:
    router = Router()
    calls: list[int] = []

    @router.task("count")
    def count(payload: Any, ctx: TaskContext) -> dict[Any, Any]:
        calls.append(1)
        return {1: "one", "total": 1}

    store = SqliteStore(str(tmp_path / "runs.db"))
    client = create_app(router, store=store, auth="none", clock=clock).test_client()
    first = client.post("/tasks/count", headers=task_headers(), data=json.dumps({}))
    assert first.headers["X-Tasklease-Outcome"] == "processed", first.get_json()
    assert first.get_json()["result"] == {"1": "one", "total": 1}
    record = store.get(first.headers["X-Tasklease-Run-Id"])
    assert record is not None
    assert record.status is RunStatus.COMPLETED
    duplicate = client.post("/tasks/count", headers=task_headers(retry=1), data=json.dumps({}))
    assert duplicate.headers["X-Tasklease-Outcome"] == "duplicate"
    assert duplicate.get_json()["result"] == {"1": "one", "total": 1}
    assert calls == [1]
