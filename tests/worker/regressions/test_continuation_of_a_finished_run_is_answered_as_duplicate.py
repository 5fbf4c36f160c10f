"""A continuation task enqueued by an attempt whose record write was then refused (its lease
lapsed; the attempt that took over finished the run without continuing) must be answered 200
once the run is finished: a 409 or 400 makes Cloud Tasks retry it until its retries run out."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from tasklease import PermanentFailure, protocol
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.identity import DeliveryIdentity, Kind
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import CapturingProducer, FakeClock, task_headers

RUN_ID = DeliveryIdentity(Kind.TASK, "h", queue="default", task_name="t-1").run_id


def _app(tmp_path: Path, chain: int) -> tuple[Any, SqliteStore]:
    def handler(payload: Any, ctx: TaskContext) -> Any:
        if ctx.continuation < chain:
            ctx.continue_later({"n": ctx.continuation + 1}, delay=timedelta(0))
            return None
        return "done"

    router = Router()
    router.task("h")(handler)
    router.use_producer(CapturingProducer())  # type: ignore[arg-type]
    store = SqliteStore(tmp_path / "runs.db")
    return create_app(router, store=store, auth="none", clock=FakeClock()).test_client(), store


def _post(client: Any, task: str, seq: int | None = None) -> Any:
    extra = {protocol.CONTINUATION_HEADER: f"{RUN_ID}:{seq}"} if seq else {}
    return client.post("/tasks/h", headers=task_headers(task=task) | extra, data=json.dumps({}))


def test_a_stray_continuation_of_a_run_completed_after_continuing_is_answered_200(
    tmp_path: Path,
) -> None:
    client, store = _app(tmp_path, chain=1)
    assert _post(client, "t-1").headers[protocol.OUTCOME_HEADER] == "processed"
    assert _post(client, "c-1", seq=1).headers[protocol.OUTCOME_HEADER] == "processed"
    record = store.get(RUN_ID)
    assert record is not None and record.status is RunStatus.COMPLETED
    stray = _post(client, "c-2", seq=2)  # Enqueued by a refused attempt of delivery 1.
    assert stray.status_code == 200, stray.get_json()


def test_a_stray_first_continuation_of_a_run_completed_without_continuing_is_answered_200(
    tmp_path: Path,
) -> None:
    client, store = _app(tmp_path, chain=0)
    assert _post(client, "t-1").headers[protocol.OUTCOME_HEADER] == "processed"
    record = store.get(RUN_ID)
    assert record is not None and record.status is RunStatus.COMPLETED
    stray = _post(client, "c-1", seq=1)  # Enqueued by a refused attempt of delivery 0.
    assert stray.status_code == 200, stray.get_json()


def test_a_stray_continuation_of_a_run_that_failed_is_answered_200_without_running(
    tmp_path: Path,
) -> None:
    ran: list[int] = []

    def handler(payload: Any, ctx: TaskContext) -> Any:
        ran.append(ctx.continuation)
        if ctx.continuation == 0:
            ctx.continue_later({"n": 1})
            return None
        raise PermanentFailure("the second delivery gives up")

    router = Router()
    router.task("h")(handler)
    router.use_producer(CapturingProducer())  # type: ignore[arg-type]
    store = SqliteStore(tmp_path / "runs.db")
    client = create_app(router, store=store, auth="none", clock=FakeClock()).test_client()
    assert _post(client, "t-1").headers[protocol.OUTCOME_HEADER] == "processed"
    assert _post(client, "c-1", seq=1).headers[protocol.OUTCOME_HEADER] == "failed"
    stray = _post(client, "c-2", seq=2)
    assert (stray.status_code, stray.headers[protocol.OUTCOME_HEADER]) == (200, "duplicate")
    assert stray.get_json()["status"] == "failed"
    assert ran == [0, 1]


def test_a_continuation_naming_a_finished_run_of_another_handler_gets_no_answer_of_it(
    tmp_path: Path,
) -> None:
    router = Router()
    router.task("h")(lambda payload, ctx: "secret")
    router.task("other")(lambda payload, ctx: None)
    store = SqliteStore(tmp_path / "runs.db")
    client = create_app(router, store=store, auth="none", clock=FakeClock()).test_client()
    assert _post(client, "t-1").headers[protocol.OUTCOME_HEADER] == "processed"
    headers = task_headers(task="c-1") | {protocol.CONTINUATION_HEADER: f"{RUN_ID}:1"}
    reply = client.post("/tasks/other", headers=headers, data=json.dumps({}))
    assert reply.status_code == 400
    assert "secret" not in reply.get_data(as_text=True)
