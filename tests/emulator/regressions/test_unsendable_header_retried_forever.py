"""Finding: a task whose header http.client refuses to send (a CR/LF in a value, characters
outside Latin-1) was accepted by CreateTask, and every attempt failed before it was sent; that
path rescheduled the task a second later without counting the attempt, so the task was
retried about once a second forever, past the queue's max_attempts, with an ERROR line each
time. CreateTask refuses such headers (INVALID_ARGUMENT), and an attempt that cannot be sent
is a failed attempt like any other: the retry policy ends it."""

from __future__ import annotations

import time

import pytest

from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator.model import ApiError, rfc3339
from tasklease.emulator.rows import TaskRow

QUEUE = "projects/p/locations/us-central1/queues/q"


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "snow\u2603man", "nul\0"])
def test_create_task_refuses_a_header_that_cannot_be_sent(value: str) -> None:
    with CloudTasksEmulator() as emulator:
        emulator.create_queue(QUEUE)
        http = {"url": "http://127.0.0.1:9/x", "headers": {"X-Bad": value}}
        with pytest.raises(ApiError) as refused:
            emulator.api.create_task(QUEUE, {"task": {"httpRequest": http}})
        assert refused.value.status == "INVALID_ARGUMENT"
        assert emulator.db.count_tasks() == 0


# 127.0.0.1 goes out from the dispatcher's own thread, https from a pool thread.
@pytest.mark.parametrize("url", ["http://127.0.0.1:9/x", "https://127.0.0.1:9/x"])
def test_a_stored_task_with_an_unsendable_header_ends_after_max_attempts(url: str) -> None:
    with CloudTasksEmulator() as emulator:
        emulator.create_queue(
            QUEUE, retryConfig={"maxAttempts": 2, "minBackoff": "0.1s", "maxBackoff": "0.1s"}
        )
        now_us = time.time_ns() // 1000
        name = f"{QUEUE}/tasks/bad-header"
        spec = {  # As stored by an emulator that did not check headers.
            "name": name,
            "httpRequest": {"url": url, "httpMethod": "POST", "headers": {"X-Bad": "a\nb"}},
            "scheduleTime": rfc3339(now_us),
            "dispatchDeadline": "600s",
        }
        row = TaskRow(name, QUEUE, spec, now_us, now_us, 0, 0, None, None, None, None, None, False)
        assert emulator.db.insert_task(row, now_us)
        emulator.dispatcher.wake()
        emulator.join(timeout=8)  # Two failed attempts, then deleted: not retried forever.
        assert emulator.db.get_task(name) is None
