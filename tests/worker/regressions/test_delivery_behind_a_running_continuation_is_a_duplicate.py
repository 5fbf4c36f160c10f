"""A delivery of a run that its chain has moved past is answered as a duplicate (200) even
while a later delivery holds the run. It was answered 409 (in progress): Cloud Tasks then
retried a delivery that would never run, and Cloud Scheduler counted a failed attempt of the
job (a duplicate Scheduler delivery of a slot whose continuation was running)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tasklease import protocol
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.producer.test_scheduled_continuations import (
    fire,
    outcome,
    resume,
    scheduled_run_id,
)
from tests.support.helpers import CapturingProducer, FakeClock


def test_a_duplicate_scheduler_delivery_while_the_continuation_runs_is_a_duplicate(
    tmp_path: Path,
) -> None:
    entered, go = threading.Event(), threading.Event()
    router = Router()

    @router.scheduled("nightly", queue="reports")
    def nightly(ctx: TaskContext) -> Any:
        if ctx.continuation == 0:
            ctx.continue_later({"page": 1})
            return None
        entered.set()
        assert go.wait(10)
        return {"pages": 2}

    router.use_producer(CapturingProducer())  # type: ignore[arg-type]
    store = SqliteStore(tmp_path / "runs.db")
    app = create_app(router, store=store, auth="none", clock=FakeClock())
    assert outcome(fire(app)) == "processed"
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(resume, app, scheduled_run_id(), 1)
        assert entered.wait(10)
        again = fire(app)  # The Scheduler's duplicate of the slot's delivery.
        assert (again.status_code, outcome(again)) == (200, "duplicate")
        go.set()
        assert outcome(running.result(10)) == "processed"
    assert outcome(fire(app)) == "duplicate"
    assert again.headers[protocol.OUTCOME_HEADER] == "duplicate"
