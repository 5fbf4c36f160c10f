"""The emulator's Cloud Tasks-like metrics: queue depth, attempts by response code, delays."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from werkzeug import Response

from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator import metrics as emulator_metrics
from tasklease.emulator.sender import AttemptResult
from tests.support.emulator_target import Target

QUEUE = "projects/p/locations/us-central1/queues/q"


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    emulator_metrics.use_provider(provider)
    yield reader
    emulator_metrics.use_provider()
    provider.shutdown()


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def create(emulator: CloudTasksEmulator, url: str, task_id: str, **task: Any) -> None:
    body = base64.b64encode(b"{}").decode()
    spec = {"name": f"{QUEUE}/tasks/{task_id}", "httpRequest": {"url": url, "body": body}}
    emulator.api.create_task(QUEUE, {"task": spec | task})


def test_attempts_by_response_code_delays_and_depth(
    reader: InMemoryMetricReader, emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    recorder.answer = lambda n: Response("busy", 503) if n == 1 else Response("ok")
    seen: list[tuple[str, int | None]] = []

    def listener(queue: str, result: AttemptResult) -> None:
        seen.append((queue, result.status))

    emulator_metrics.add_listener(listener)
    try:
        emulator.create_queue(QUEUE, retryConfig={"minBackoff": "0.05s"})
        create(emulator, url, "t1")
        emulator.join()
    finally:
        emulator_metrics.remove_listener(listener)
    attempts = {
        (p.attributes["queue_id"], p.attributes["response_code"]): p.value
        for p in points(reader, "cloudtasks.queue.task_attempt_count")
    }
    assert attempts == {("q", "503"): 1, ("q", "200"): 1}
    assert seen == [("q", 503), ("q", 200)]
    [delays] = points(reader, "cloudtasks.queue.task_attempt_delays")
    assert delays.count == 2
    assert delays.max >= 0

    tomorrow = datetime.now(UTC) + timedelta(days=1)
    create(emulator, url, "later", scheduleTime=tomorrow.strftime("%Y-%m-%dT%H:%M:%SZ"))
    depth = {p.attributes["queue_id"]: p.value for p in points(reader, "cloudtasks.queue.depth")}
    assert depth == {"q": 1}
    assert requests.get(f"{emulator.url}/v2/{QUEUE}", timeout=5).status_code == 200
    assert requests.get(f"{emulator.url}/v2/{QUEUE}x", timeout=5).status_code == 404
    calls = {
        (p.attributes["method"], p.attributes["response_code"]): p.value
        for p in points(reader, "cloudtasks.api.request_count")
    }
    assert calls == {("GET", "200"): 1, ("GET", "404"): 1}
