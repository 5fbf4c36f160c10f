"""Finding: a concurrency key holding a character a store cannot keep (a lone surrogate,
which JSON's ``"\\ud800"`` decodes to, on any SQL store; NUL on Postgres) went into the
lock's name as it was. Taking the lock then crashed (a 500, UnicodeEncodeError) or was taken
for the store being down (a 503, not counted as an attempt): every delivery claimed the run,
failed to lock and gave it back, so the task neither ran nor became a dead letter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.base.store import LeaseStore
from tasklease.worker.stores.postgres.store import PostgresStore
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import task_headers


def _post_twice(store: LeaseStore, body: str) -> list[int]:
    router = Router()
    calls: list[int] = []

    @router.task("post_ledger", concurrency_key=lambda payload: payload["account"])
    def post_ledger(payload: Any, ctx: TaskContext) -> None:
        calls.append(1)

    client = create_app(router, store=store, auth="none").test_client()
    for task in ("first", "second"):
        answer = client.post("/tasks/post_ledger", headers=task_headers(task=task), data=body)
        assert answer.headers["X-Tasklease-Outcome"] == "processed", answer.get_json()
        retry = client.post(
            "/tasks/post_ledger", headers=task_headers(task=task, retry=1), data=body
        )
        assert retry.headers["X-Tasklease-Outcome"] == "duplicate", retry.get_json()
    return calls


@pytest.fixture
def postgres(postgres_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore.from_url(postgres_url)
    yield store
    store.close()


def test_a_key_with_a_lone_surrogate_runs_each_task_once_on_sqlite(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "runs.db"))
    assert _post_twice(store, '{"account": "acct-\\ud800"}') == [1, 1]


def test_a_key_with_a_nul_runs_each_task_once_on_postgres(postgres: PostgresStore) -> None:
    assert _post_twice(postgres, '{"account": "acct-\\u0000"}') == [1, 1]
