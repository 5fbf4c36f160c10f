"""Finding: a target answering 503 with ``Retry-After: 10000000000000`` stopped the recording
of attempts for every queue. The delay, in microseconds, overflowed SQLite's 64-bit integers;
the batch of ended attempts failed with OverflowError and was retried together with every
later attempt, forever: tasks of other queues whose targets answered 200 stayed in flight.
Every value read from a target is now bounded, and one attempt that cannot be recorded no
longer holds back the others."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from tasklease.emulator import CloudTasksEmulator

PARENT = "projects/p/locations/us-central1"
SLOW, FAST = f"{PARENT}/queues/slow", f"{PARENT}/queues/fast"
DAY_US = 86_400 * 1_000_000


@pytest.fixture
def paths(_target_server: HTTPServer) -> Iterator[tuple[HTTPServer, list[str]]]:
    hits: list[str] = []

    def busy(request: Request) -> Response:
        hits.append("busy")
        return Response("busy", status=503, headers={"Retry-After": "10000000000000"})

    def fine(request: Request) -> Response:
        hits.append("fine")
        return Response("ok")

    _target_server.clear()
    _target_server.expect_request("/busy").respond_with_handler(busy)
    _target_server.expect_request("/fine").respond_with_handler(fine)
    yield _target_server, hits
    _target_server.clear()


def task(url: str) -> dict[str, object]:
    return {"task": {"httpRequest": {"url": url, "body": base64.b64encode(b"{}").decode()}}}


def test_a_huge_retry_after_delays_its_task_and_stops_no_other_queue(
    paths: tuple[HTTPServer, list[str]],
) -> None:
    server, hits = paths
    with CloudTasksEmulator() as emulator:
        emulator.create_queue(SLOW)
        emulator.create_queue(FAST)
        busy = emulator.api.create_task(SLOW, task(server.url_for("/busy")))
        deadline = time.monotonic() + 10
        while "busy" not in hits and time.monotonic() < deadline:
            time.sleep(0.02)
        assert hits == ["busy"]
        emulator.api.create_task(FAST, task(server.url_for("/fine")))
        emulator.join(FAST, timeout=10)  # Recorded and deleted: its target answered 200.
        emulator.api.create_task(FAST, task(server.url_for("/fine")))
        emulator.join(FAST, timeout=10)
        left = emulator.db.get_task(busy["name"])
    assert left is not None and not left.in_flight
    assert left.dispatch_count == 1
    assert left.schedule_us - time.time_ns() // 1000 <= 32 * DAY_US
