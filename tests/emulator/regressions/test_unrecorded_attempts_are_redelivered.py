"""Findings: (1) a dispatch-pool attempt (RunTask's, or any to a TLS or DNS-named target) whose
recording failed fell back to rescheduling its task, and when that write failed too the task
stayed in flight, never dispatched again (RunTask included) until a restart. (2) A Cloud
Scheduler run waiting to retry lived only in a thread: stopping the emulator fired its retry
at once, ignoring the backoff, and the restarted emulator never sent it again. Both are
losses: what is owed is kept (in memory until recorded; in the database for Scheduler
retries) and delivered."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
from werkzeug import Response

from tasklease.emulator import CloudTasksEmulator
from tests.support.emulator_faults import fail_attempt_records
from tests.support.emulator_target import Target

PARENT = "projects/p/locations/us-central1"
QUEUE = f"{PARENT}/queues/q"
JOB = f"{PARENT}/jobs/retried"


def test_a_pool_attempt_whose_recording_fails_twice_is_not_stranded(
    target: tuple[Target, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder, url = target
    with CloudTasksEmulator() as emulator:
        failures = fail_attempt_records(emulator, monkeypatch, times=2)  # Two in a row.
        emulator.create_queue(QUEUE)
        later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 86_400))
        task = {
            "name": f"{QUEUE}/tasks/run-now",
            "scheduleTime": later,
            "httpRequest": {"url": url, "body": base64.b64encode(b"{}").decode()},
        }
        emulator.api.create_task(QUEUE, {"task": task})
        emulator.api.run_task(f"{QUEUE}/tasks/run-now")  # RunTask: the pool's thread.
        emulator.join(timeout=10)
        assert failures == [1, 1]
        assert len(recorder.hits) == 1


def test_a_scheduler_run_waiting_to_retry_survives_a_restart(
    target: tuple[Target, str], tmp_path: Path
) -> None:
    recorder, url = target
    recorder.answer = lambda n: Response("no", status=500) if n == 1 else Response("ok")
    job = {
        "name": JOB,
        "schedule": "0 0 1 1 *",
        "httpTarget": {"uri": url},
        "retryConfig": {"retryCount": 2, "minBackoffDuration": "2s", "maxBackoffDuration": "2s"},
    }
    with CloudTasksEmulator(data_dir=tmp_path, scheduler_on_schedule=False) as emulator:
        emulator.scheduler_api.create_job(PARENT, job)
        emulator.scheduler_api.run_job(JOB)
        deadline = time.monotonic() + 10
        while not recorder.hits and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(recorder.hits) == 1, "stopping sent the retry at once, before its backoff"
    with CloudTasksEmulator(data_dir=tmp_path, scheduler_on_schedule=False):
        deadline = time.monotonic() + 10
        while len(recorder.hits) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(recorder.hits) == 2, "the retry owed before the restart was never sent"
    first, retry = (hit.headers["X-Cloudscheduler-Scheduletime"] for hit in recorder.hits)
    assert first == retry
