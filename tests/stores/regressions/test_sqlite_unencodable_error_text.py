"""Finding: error text holding a lone surrogate (e.g. a file name decoded with
surrogateescape) cannot be bound by sqlite3; the finish raises UnicodeEncodeError, not
StoreUnavailable, so a permanent failure is never recorded and the handler runs again."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from tasklease.errors import PermanentFailure
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import FakeClock, task_headers


def test_a_permanent_failure_naming_an_undecodable_file_is_recorded_and_never_rerun(
    tmp_path: Path, clock: FakeClock
) -> None:
    router = Router()
    calls: list[int] = []

    @router.task("import_file", lease=timedelta(seconds=30))
    def import_file(payload: Any, ctx: TaskContext) -> None:
        calls.append(1)
        name = os.fsdecode(b"report-\xff.csv")  # 'report-\udcff.csv', as os.listdir gives it.
        raise PermanentFailure(f"cannot parse {name}")

    store = SqliteStore(tmp_path / "runs.db")
    app = create_app(router, store=store, auth="none", clock=clock)
    client = app.test_client()
    first = client.post("/tasks/import_file", headers=task_headers(), data=json.dumps({}))
    clock.advance(timedelta(minutes=5))  # Well past the lease.
    again = client.post(
        "/tasks/import_file", headers=task_headers(retry=1, execution=1), data=json.dumps({})
    )
    assert len(calls) == 1, (first.status_code, again.headers["X-Tasklease-Outcome"])
    assert (first.status_code, first.headers["X-Tasklease-Outcome"]) == (200, "failed")
    assert again.headers["X-Tasklease-Outcome"] == "duplicate"
