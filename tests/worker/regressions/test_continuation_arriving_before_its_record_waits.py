"""A delivery that continues enqueues the continuation first and records it after: with no
delay, Cloud Tasks may deliver continuation 1 while the record still names none. It was
answered 400 "names a run never continued" (a forged header's answer) for a real task;
it must wait (409) for the run to record it, as a continuation ahead of its run does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import flask

from tasklease import protocol
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.identity import DeliveryIdentity, Kind
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import FakeClock, task_headers


class DeliveringProducer:
    """Delivers each continuation at once, before the worker has recorded it."""

    def __init__(self) -> None:
        self.app: flask.Flask | None = None
        self.answers: list[tuple[int, str]] = []

    def enqueue(
        self, task_name: str, payload: Any = None, key: str | None = None, **kw: Any
    ) -> Any:
        assert self.app is not None
        reply = self.app.test_client().post(
            f"/tasks/{task_name}",
            headers=task_headers(task="c-1", **kw["headers"]),
            data=json.dumps(payload),
        )
        self.answers.append((reply.status_code, reply.headers[protocol.OUTCOME_HEADER]))


def test_a_continuation_delivered_before_its_record_names_it_waits_for_the_run(
    tmp_path: Path,
) -> None:
    router = Router()

    @router.task("h")
    def handler(payload: Any, ctx: TaskContext) -> Any:
        if ctx.continuation == 0:
            ctx.continue_later({"next": 1})
            return None
        return ctx.state

    producer = DeliveringProducer()
    router.use_producer(producer)  # type: ignore[arg-type]
    store = SqliteStore(tmp_path / "runs.db")
    app = create_app(router, store=store, auth="none", clock=FakeClock())
    producer.app = app
    first = app.test_client().post("/tasks/h", headers=task_headers(task="t-1"), data=b"{}")
    assert first.headers[protocol.OUTCOME_HEADER] == "processed"
    assert producer.answers == [(409, "in_progress")]  # Not 400: its retry will run it.
    run_id = DeliveryIdentity(Kind.TASK, "h", queue="default", task_name="t-1").run_id
    retried = app.test_client().post(
        "/tasks/h",
        headers=task_headers(task="c-1", retry=1) | {protocol.CONTINUATION_HEADER: f"{run_id}:1"},
        data=b"{}",
    )
    assert retried.get_json()["result"] == {"next": 1}
