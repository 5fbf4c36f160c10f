"""Finding: ``ctx.continue_later(state, delay=...)`` accepted a delay no continuation can
have: past Cloud Tasks' 30-day limit on a schedule time (the producer then refused the
continuation with ``InvalidTask``), negative (``ValueError``), NaN or infinite (the
recorded JSON could not even hold it). Each of these released the run for a retry, so the
handler ran again on every delivery, up to the queue's max_attempts (100 by default),
repeating whatever it does outside its steps, to fail the same way each time. The delay is
checked in ``continue_later`` and a wrong one fails the run (a dead letter naming it): no
retry can change it."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease import protocol
from tasklease.producer import Producer
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import FakeClock, task_headers


@pytest.mark.parametrize(
    "delay", [timedelta(days=31), -1.0, math.nan, math.inf, timedelta.max], ids=repr
)
def test_an_impossible_continuation_delay_fails_the_run_instead_of_running_it_again(
    tmp_path: Path, delay: Any
) -> None:
    ran: list[int] = []

    def handler(payload: Any, ctx: TaskContext) -> None:
        ran.append(ctx.attempt)  # An effect outside any step.
        ctx.continue_later({"page": 2}, delay=delay)

    router = Router()
    router.task("h")(handler)
    # Never reached: every impossible delay is refused before any call.
    router.use_producer(
        Producer("p", "l", "default", "http://w", tasks_endpoint="http://127.0.0.1:9")
    )
    store = SqliteStore(tmp_path / "runs.db")
    client = create_app(router, store=store, auth="none", clock=FakeClock()).test_client()
    for retry in range(2):  # The delivery, and Cloud Tasks' retry if it was not a 2xx.
        answer = client.post(
            "/tasks/h", headers=task_headers(task="t-1", retry=retry), data=json.dumps({})
        )
    assert ran == [1]
    assert answer.status_code == 200
    assert answer.headers[protocol.OUTCOME_HEADER] in ("failed", "duplicate")
    record = store.list_runs()[0]
    assert record.status.value == "failed" and "delay" in (record.error or "")
