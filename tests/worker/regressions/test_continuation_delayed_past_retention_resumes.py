"""A continuation delayed past the handler's retention must still resume its run: the record
holding its state and steps has to be kept until the continuation can arrive."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from tasklease import protocol
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.identity import DeliveryIdentity, Kind
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import CapturingProducer, FakeClock, task_headers


def test_a_continuation_delayed_longer_than_the_retention_resumes_the_run_with_its_state(
    tmp_path: Path,
) -> None:
    seen: list[Any] = []

    def handler(payload: Any, ctx: TaskContext) -> Any:
        seen.append((ctx.continuation, ctx.state))
        ctx.step(f"chunk-{ctx.continuation}", lambda: ctx.continuation)
        if ctx.continuation == 0:
            ctx.continue_later({"next": 1}, delay=timedelta(hours=3))
            return None
        return "done"

    router = Router()
    router.task("h", retention=timedelta(hours=2))(handler)
    router.use_producer(CapturingProducer())  # type: ignore[arg-type]
    clock = FakeClock()
    app = create_app(router, store=SqliteStore(tmp_path / "runs.db"), auth="none", clock=clock)
    run_id = DeliveryIdentity(Kind.TASK, "h", queue="default", task_name="t-1").run_id
    client = app.test_client()
    first = client.post("/tasks/h", headers=task_headers(task="t-1"), data=json.dumps({}))
    assert first.headers[protocol.OUTCOME_HEADER] == "processed"

    clock.advance(timedelta(hours=3))  # The continuation's delay has passed.
    headers = task_headers(task="c-1") | {protocol.CONTINUATION_HEADER: f"{run_id}:1"}
    reply = client.post("/tasks/h", headers=headers, data=json.dumps({}))
    assert (reply.status_code, reply.headers.get(protocol.OUTCOME_HEADER)) == (200, "processed")
    assert seen == [(0, None), (1, {"next": 1})]


def test_a_late_duplicate_of_the_first_task_during_a_long_delay_neither_reruns_nor_loses_it(
    tmp_path: Path,
) -> None:
    seen: list[Any] = []

    def handler(payload: Any, ctx: TaskContext) -> Any:
        seen.append(ctx.continuation)
        if ctx.continuation == 0:
            ctx.continue_later({"next": 1}, delay=timedelta(hours=3))
            return None
        return "done"

    router = Router()
    router.task("h", retention=timedelta(hours=2))(handler)
    router.use_producer(CapturingProducer())  # type: ignore[arg-type]
    clock = FakeClock()
    store = SqliteStore(tmp_path / "runs.db")
    client = create_app(router, store=store, auth="none", clock=clock).test_client()
    run_id = DeliveryIdentity(Kind.TASK, "h", queue="default", task_name="t-1").run_id
    client.post("/tasks/h", headers=task_headers(task="t-1"), data=json.dumps({}))

    clock.advance(timedelta(hours=2))  # A duplicate of the first task, a retention later.
    duplicate = client.post("/tasks/h", headers=task_headers(task="t-1"), data=json.dumps({}))
    assert duplicate.headers[protocol.OUTCOME_HEADER] == "duplicate"

    clock.advance(timedelta(hours=2, minutes=30))  # The continuation: due 90 minutes ago.
    store.purge_expired(clock())
    headers = task_headers(task="c-1") | {protocol.CONTINUATION_HEADER: f"{run_id}:1"}
    reply = client.post("/tasks/h", headers=headers, data=json.dumps({}))
    assert reply.headers[protocol.OUTCOME_HEADER] == "processed"
    late = client.post("/tasks/h", headers=task_headers(task="t-1"), data=json.dumps({}))
    assert late.headers[protocol.OUTCOME_HEADER] == "duplicate"
    assert seen == [0, 1]
