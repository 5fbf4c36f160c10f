"""What the emulator sends to targets, and when: headers, tokens, backoff, limits, faults."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from werkzeug import Response

from tasklease.emulator import CloudTasksEmulator, Faults
from tasklease.emulator.api import CERTS_PATH
from tasklease.emulator.model import ApiError
from tasklease.worker.auth.authenticators import AuthRequest, OidcAuth
from tasklease.worker.core.identity import Kind
from tasklease.worker.handlers.router import HandlerSpec
from tests.support.emulator_target import Target

QUEUE = "projects/p/locations/us-central1/queues/q"
SA = "tasks@p.iam.gserviceaccount.com"


def create(emulator: CloudTasksEmulator, url: str, task_id: str, **http: object) -> None:
    task = {
        "name": f"{QUEUE}/tasks/{task_id}",
        "httpRequest": {"url": url, "body": base64.b64encode(b'{"n": 1}').decode(), **http},
    }
    emulator.api.create_task(QUEUE, {"task": task})


def test_dispatch_sends_method_body_headers_and_cloud_tasks_headers(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    emulator.create_queue(QUEUE)
    before = time.time()
    create(emulator, url, "t1", headers={"Content-Type": "application/json", "X-Custom": "v"})
    emulator.join()
    [hit] = recorder.hits
    assert json.loads(hit.body) == {"n": 1}
    headers = hit.headers
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Custom"] == "v"
    assert headers["X-Cloudtasks-Queuename"] == "q"
    assert headers["X-Cloudtasks-Taskname"] == "t1"
    assert headers["X-Cloudtasks-Taskretrycount"] == "0"
    assert headers["X-Cloudtasks-Taskexecutioncount"] == "0"
    assert before - 1 < float(headers["X-Cloudtasks-Tasketa"]) < time.time()
    assert "X-Cloudtasks-Taskpreviousresponse" not in headers
    assert headers["User-Agent"] == "Google-Cloud-Tasks"
    [delivery] = emulator.deliveries()
    assert (delivery.status, delivery.attempt, delivery.name) == (200, 1, f"{QUEUE}/tasks/t1")


def test_oidc_token_verifies_through_google_auth_against_the_emulators_keys(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    emulator.create_queue(QUEUE)
    create(emulator, url, "signed", oidcToken={"serviceAccountEmail": SA})
    emulator.join()
    auth = OidcAuth([SA], audience=url, certs_url=emulator.url + CERTS_PATH)
    spec = HandlerSpec(Kind.TASK, "hit", lambda p, c: None)
    result = auth.authenticate(AuthRequest(recorder.hits[0].headers["Authorization"], url), spec)
    assert (result.status, result.principal) == (200, SA)


def test_schedule_time_is_honoured(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    emulator.create_queue(QUEUE)
    at = datetime.now(UTC) + timedelta(seconds=0.6)
    emulator.api.create_task(
        QUEUE,
        {
            "task": {
                "name": f"{QUEUE}/tasks/later",
                "scheduleTime": at.isoformat().replace("+00:00", "Z"),
                "httpRequest": {"url": url},
            }
        },
    )
    time.sleep(0.3)
    assert recorder.hits == []
    emulator.join()
    assert float(recorder.hits[0].headers["X-Cloudtasks-Tasketa"]) == pytest.approx(
        at.timestamp(), abs=1e-3
    )


def test_failures_are_retried_with_the_backoff_formula_then_given_up(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    recorder.answer = lambda n: Response("boom", status=500)
    emulator.create_queue(
        QUEUE,
        retryConfig={
            "maxAttempts": 5,
            "minBackoff": "0.1s",
            "maxBackoff": "0.3s",
            "maxDoublings": 1,
        },
    )
    create(emulator, url, "failing")
    emulator.join(timeout=10)
    assert len(recorder.hits) == 5  # Then the task is deleted.
    gaps = [b.at - a.at for a, b in zip(recorder.hits, recorder.hits[1:], strict=False)]
    expected = [0.1, 0.2, 0.3, 0.3]  # Doubling once, then +0.2 per retry, capped at 0.3.
    assert all(gap >= want - 0.01 for gap, want in zip(gaps, expected, strict=True)), gaps
    assert [h.headers["X-Cloudtasks-Taskretrycount"] for h in recorder.hits] == [
        "0",
        "1",
        "2",
        "3",
        "4",
    ]
    # 5xx answers are not executions: the count stays 0 while the retry count grows
    # (docs/platform-facts.md; captured from production in aertje/cloud-tasks-emulator#114).
    assert {h.headers["X-Cloudtasks-Taskexecutioncount"] for h in recorder.hits} == {"0"}
    assert recorder.hits[1].headers["X-Cloudtasks-Taskpreviousresponse"] == "500"
    assert recorder.hits[1].headers["X-Cloudtasks-Taskretryreason"] == ""  # Empty for HTTP.
    assert "X-Cloudtasks-Taskretryreason" not in recorder.hits[0].headers
    assert emulator.db.count_tasks() == 0
    with pytest.raises(
        ApiError, match="existed too recently"
    ):  # Given up on, the name stays taken.
        create(emulator, url, "failing")


def test_retry_after_on_503_is_honoured(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    recorder.answer = lambda n: (
        Response("busy", status=503, headers={"Retry-After": "1"}) if n == 1 else Response("ok")
    )
    emulator.create_queue(QUEUE, retryConfig={"minBackoff": "0.05s"})
    create(emulator, url, "throttled")
    emulator.join(timeout=10)
    assert len(recorder.hits) == 2
    assert recorder.hits[1].at - recorder.hits[0].at >= 0.99


def test_rate_limit_spaces_dispatches(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    emulator.create_queue(QUEUE, rateLimits={"maxDispatchesPerSecond": 5})
    emulator.client().pause_queue(name=QUEUE)
    for n in range(12):
        create(emulator, url, f"r{n}")
    emulator.client().resume_queue(name=QUEUE)
    emulator.join(timeout=20)
    times = sorted(hit.at for hit in recorder.hits)
    # A burst of 5 (one second's worth), then 5 per second: the 12th no sooner than 1.4 s.
    assert times[-1] - times[0] >= 1.3


def test_concurrency_limit_is_never_exceeded(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    recorder.delay = 0.1
    emulator.create_queue(QUEUE, rateLimits={"maxConcurrentDispatches": 2})
    for n in range(8):
        create(emulator, url, f"c{n}")
    emulator.join(timeout=20)
    assert len(recorder.hits) == 8
    assert recorder.max_concurrent == 2


def test_503_answers_halve_the_queues_dispatch_rate_each_time(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    recorder.answer = lambda n: Response("busy", status=503)
    emulator.create_queue(QUEUE, retryConfig={"maxAttempts": 2, "minBackoff": "0.01s"})
    for n in range(2):
        create(emulator, url, f"t{n}")
    emulator.join(timeout=20)
    assert len(recorder.hits) == 4
    assert emulator.dispatcher.rate(QUEUE) == 500 / 16


def test_duplicate_fault_sends_each_attempt_twice(target: tuple[Target, str]) -> None:
    recorder, url = target
    with CloudTasksEmulator(faults=Faults(duplicate=1.0)) as emulator:
        emulator.create_queue(QUEUE)
        create(emulator, url, "twice")
        emulator.join()
        faults = [d.fault for d in emulator.deliveries()]
    assert len(recorder.hits) == 2
    assert {h.headers["X-Cloudtasks-Taskretrycount"] for h in recorder.hits} == {"0"}
    assert sorted(faults, key=str) == [None, "duplicate"]


def test_lost_response_fault_retries_a_task_the_target_answered(target: tuple[Target, str]) -> None:
    recorder, url = target
    with CloudTasksEmulator(faults=Faults(lost_response=1.0)) as emulator:
        emulator.create_queue(QUEUE, retryConfig={"maxAttempts": 3, "minBackoff": "0.01s"})
        create(emulator, url, "lost")
        emulator.join()
        deliveries = emulator.deliveries()
    assert len(recorder.hits) == 3
    assert [d.fault for d in deliveries] == ["lost_response"] * 3
    # No answer reached the queue, so no execution was counted.
    assert [h.headers["X-Cloudtasks-Taskexecutioncount"] for h in recorder.hits] == ["0", "0", "0"]
    assert "X-Cloudtasks-Taskpreviousresponse" not in recorder.hits[1].headers
    assert "X-Cloudtasks-Taskretryreason" not in recorder.hits[1].headers


def test_answers_other_than_5xx_count_as_executions(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    answers = {1: 404, 2: 500, 3: 429}
    recorder.answer = lambda n: Response("", status=answers.get(n, 200))
    emulator.create_queue(QUEUE, retryConfig={"minBackoff": "0.01s", "maxBackoff": "0.01s"})
    create(emulator, url, "mixed")
    emulator.join(timeout=10)
    counts = [h.headers["X-Cloudtasks-Taskexecutioncount"] for h in recorder.hits]
    assert counts == ["0", "1", "1", "2"]
    assert [h.headers.get("X-Cloudtasks-Taskpreviousresponse") for h in recorder.hits] == [
        None,
        "404",
        "500",
        "429",
    ]


def test_stop_lets_an_attempt_under_way_end_and_records_it(
    tmp_path: Path, target: tuple[Target, str]
) -> None:
    recorder, url = target
    recorder.delay = 0.5
    with CloudTasksEmulator(data_dir=tmp_path) as emulator:
        emulator.create_queue(QUEUE)
        create(emulator, url, "slow")
        deadline = time.monotonic() + 10
        while not recorder.hits:  # Sent: the answer is half a second away.
            assert time.monotonic() < deadline
            time.sleep(0.01)
    with CloudTasksEmulator(data_dir=tmp_path) as emulator:
        assert [d.status for d in emulator.deliveries(QUEUE)] == [200]
        assert emulator.db.count_tasks(QUEUE) == 0
