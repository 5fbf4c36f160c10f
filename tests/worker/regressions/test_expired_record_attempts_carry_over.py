"""Finding: a record past its retention counts as absent, yet the next claim carried its
attempt count over: the same task name coming back after retention was failed by
``max_attempts=1`` without running, for as long as the expired record stayed stored."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.base.store import LeaseStore
from tasklease.worker.stores.memory.store import MemoryStore
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import FakeClock, task_headers

RETENTION = timedelta(hours=1)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> LeaseStore:
    if request.param == "memory":
        return MemoryStore()
    return SqliteStore(str(tmp_path / "runs.db"))


def test_a_task_name_coming_back_after_retention_runs_again_under_max_attempts_one(
    store: LeaseStore, clock: FakeClock
) -> None:
    router = Router()
    calls: list[int] = []

    @router.task("charge", max_attempts=1, retention=RETENTION)
    def charge(payload: Any, ctx: TaskContext) -> int:
        calls.append(ctx.attempt)
        return len(calls)

    client = create_app(router, store=store, auth="none", clock=clock).test_client()
    first = client.post("/tasks/charge", headers=task_headers(), data=json.dumps({}))
    assert first.headers["X-Tasklease-Outcome"] == "processed", first.get_json()
    clock.advance(RETENTION + timedelta(seconds=1))
    record = store.get(first.get_json()["run_id"])
    assert record is not None  # Expired but not purged yet: it must count as absent.
    again = client.post("/tasks/charge", headers=task_headers(), data=json.dumps({}))
    assert again.headers["X-Tasklease-Outcome"] == "processed", again.get_json()
    assert calls == [1, 1]
