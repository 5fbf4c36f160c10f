"""Finding: tasks between 100 KB and 1 MB were refused with 413 forever. Cloud Tasks' quotas
page gives 1 MB as the maximum task size (the v2 proto comment's 100 KB is an older limit):
a worker that refuses what the queue may deliver has such a task retried until it is
dropped. The worker, the producer, the stubs and the emulator now take one limit, 1 MiB."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from google.cloud import tasks_v2

from tasklease.emulator import CloudTasksEmulator
from tasklease.producer import InvalidTask, Producer
from tasklease.producer.memory import MemoryTransport
from tasklease.testing.stubs import StubQueue
from tasklease.worker import ConfigurationError
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.memory.store import MemoryStore
from tests.support.helpers import task_headers

MIB = 1024 * 1024
LARGE = 500 * 1024  # Over the old 100 KB, well under 1 MB with the task's URL and headers.


def _router(seen: list[int]) -> Router:
    router = Router()

    @router.task("upload")
    def upload(payload: Any, ctx: TaskContext) -> int:
        seen.append(len(payload["data"]))
        return len(payload["data"])

    return router


def _body(size: int) -> bytes:
    """A JSON payload of exactly ``size`` bytes."""
    envelope = len(json.dumps({"data": ""}))
    return json.dumps({"data": "x" * (size - envelope)}).encode()


def test_the_worker_runs_a_task_between_100_kb_and_1_mib() -> None:
    seen: list[int] = []
    client = create_app(_router(seen), store=MemoryStore(), auth="none").test_client()
    response = client.post("/tasks/upload", headers=task_headers(), data=_body(MIB))
    assert response.headers["X-Tasklease-Outcome"] == "processed", response.get_json()
    assert len(seen) == 1
    over = client.post("/tasks/upload", headers=task_headers(task="t2"), data=_body(MIB + 1))
    assert over.status_code == 413
    assert over.get_json()["message"] == f"body over {MIB} bytes"


def test_the_workers_limit_is_set_by_create_app_or_tasklease_max_task_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[int] = []
    monkeypatch.setenv("TASKLEASE_MAX_TASK_BYTES", str(2 * MIB))
    from_env = create_app(_router(seen), store=MemoryStore(), auth="none").test_client()
    response = from_env.post("/tasks/upload", headers=task_headers(), data=_body(MIB + 1))
    assert response.headers["X-Tasklease-Outcome"] == "processed", response.get_json()
    argument = create_app(
        _router(seen), store=MemoryStore(), auth="none", max_task_bytes=1000
    ).test_client()
    refused = argument.post("/tasks/upload", headers=task_headers(), data=_body(1001))
    assert refused.status_code == 413
    assert refused.get_json()["message"] == "body over 1000 bytes"
    monkeypatch.setenv("TASKLEASE_MAX_TASK_BYTES", "1MB")
    with pytest.raises(ConfigurationError, match="TASKLEASE_MAX_TASK_BYTES"):
        create_app(_router(seen), store=MemoryStore(), auth="none")


def test_the_producer_enqueues_a_task_over_100_kb_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tasklease")
    transport = MemoryTransport()
    producer = Producer("p", "us-central1", "q", "https://w.example", transport=transport)
    producer.enqueue("upload", {"data": "x" * LARGE}, key="large")
    assert len(transport.tasks) == 1
    assert any("bytes" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    with pytest.raises(InvalidTask, match=f"over Cloud Tasks' {MIB}"):
        producer.enqueue("upload", {"data": "x" * MIB}, key="too-large")


def test_the_stub_queue_delivers_a_task_over_100_kb() -> None:
    seen: list[int] = []
    queue = StubQueue()
    queue.producer.enqueue("upload", {"data": "x" * LARGE}, key="large")
    app = create_app(_router(seen), store=MemoryStore(), auth="none")
    summary = queue.drain(app.test_client())
    assert summary.outcomes == {"processed": 1}
    assert seen == [LARGE]


def test_the_emulator_accepts_a_task_over_100_kb(emulator: CloudTasksEmulator) -> None:
    parent = "projects/p/locations/us-central1"
    client = emulator.client("rest")
    queue = client.create_queue(parent=parent, queue=tasks_v2.Queue(name=f"{parent}/queues/q"))
    request = tasks_v2.HttpRequest(url="http://127.0.0.1:9/tasks/upload", body=_body(LARGE))
    created = client.create_task(parent=queue.name, task=tasks_v2.Task(http_request=request))
    assert created.name.startswith(f"{queue.name}/tasks/")
