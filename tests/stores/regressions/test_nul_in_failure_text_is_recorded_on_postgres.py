"""Finding: PostgreSQL ``text`` cannot hold NUL, but a dead letter's error and payload may:
a ``PermanentFailure`` quoting a payload field that held ``\\u0000``, or a body with a raw NUL
byte (not JSON). The failure's write was refused as the store being unavailable (503), so
the run was never recorded as failed: each retry ran the handler again, until Cloud Tasks
gave up, and no dead letter was ever shown."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tasklease.errors import PermanentFailure
from tasklease.worker.core.records import RunStatus
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support.helpers import task_headers


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore.from_url(postgres_url)
    yield store
    store.close()


def test_a_permanent_failure_quoting_a_nul_is_recorded_once(store: PostgresStore) -> None:
    router = Router()
    calls: list[int] = []

    @router.task("greet")
    def greet(payload: Any, ctx: TaskContext) -> None:
        calls.append(1)
        raise PermanentFailure(f"unknown customer {payload['name']!s}")

    client = create_app(router, store=store, auth="none").test_client()
    body = json.dumps({"name": "a\u0000b"})
    first = client.post("/tasks/greet", headers=task_headers(), data=body)
    assert first.headers["X-Tasklease-Outcome"] == "failed", first.get_json()
    retry = client.post("/tasks/greet", headers=task_headers(retry=1), data=body)
    assert retry.headers["X-Tasklease-Outcome"] == "duplicate", retry.get_json()
    record = store.get(first.headers["X-Tasklease-Run-Id"])
    assert record is not None and record.status is RunStatus.FAILED
    assert record.error is not None and "unknown customer a" in record.error
    assert calls == [1]


def test_a_body_with_a_nul_byte_is_dead_lettered(store: PostgresStore) -> None:
    router = Router()

    @router.task("greet")
    def greet(payload: Any, ctx: TaskContext) -> None:
        raise AssertionError("a body that is not JSON never reaches the handler")

    client = create_app(router, store=store, auth="none").test_client()
    answer = client.post("/tasks/greet", headers=task_headers(), data=b'{"a": "\x00"}')
    assert answer.status_code == 200, answer.get_json()
    assert answer.headers["X-Tasklease-Outcome"] == "failed"
    record = store.get(answer.headers["X-Tasklease-Run-Id"])
    assert record is not None and record.status is RunStatus.FAILED
    assert record.payload is not None and "\x00" not in record.payload
