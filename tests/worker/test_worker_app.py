"""Every branch of the worker protocol, through Flask's test client."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import flask
import pytest

from tasklease.errors import ConfigurationError
from tasklease.worker import PermanentFailure, Router, TaskContext, create_app
from tasklease.worker.core import constants as c
from tasklease.worker.core.identity import Kind, parse_identity
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores import MemoryStore, SqliteStore
from tasklease.worker.stores.base import retries as store_retries
from tests.support.helpers import (
    FakeClock,
    SwitchableStore,
    claim_request,
    job_headers,
    task_headers,
)


class Shop:
    """A router whose handlers count their executions and can be told how to behave."""

    def __init__(self) -> None:
        self.router = Router()
        self.calls: Counter[str] = Counter()
        self.contexts: list[TaskContext] = []
        self.behaviour: Any = None  # Called inside the handler when set.

        @self.router.task("send_receipt", lease=timedelta(minutes=1))
        def send_receipt(payload: Any, ctx: TaskContext) -> Any:
            self.calls["send_receipt"] += 1
            self.contexts.append(ctx)
            if self.behaviour is not None:
                return self.behaviour(payload, ctx)
            return {"receipt_for": payload["order_id"]}

        @self.router.task("limited", max_attempts=2)
        def limited(payload: Any, ctx: TaskContext) -> None:
            self.calls["limited"] += 1
            raise RuntimeError("always fails")

        @self.router.scheduled("nightly")
        def nightly(ctx: TaskContext) -> str:
            self.calls["nightly"] += 1
            self.contexts.append(ctx)
            return "reports sent"


@pytest.fixture
def shop() -> Shop:
    return Shop()


@pytest.fixture
def store() -> SwitchableStore:
    return SwitchableStore(MemoryStore())


@pytest.fixture
def app(shop: Shop, store: SwitchableStore, clock: FakeClock) -> flask.Flask:
    return create_app(shop.router, store=store, auth="none", clock=clock)


def deliver(
    app: flask.Flask,
    headers: dict[str, str] | None = None,
    body: Any = None,
    path: str = "/tasks/send_receipt",
    raw: bytes | None = None,
) -> Any:
    data = raw if raw is not None else json.dumps({"order_id": 42} if body is None else body)
    return app.test_client().post(
        path, headers=task_headers() if headers is None else headers, data=data
    )


def run_id_of(
    headers: dict[str, str], handler: str = "send_receipt", kind: Kind = Kind.TASK
) -> str:
    lowered = {k.lower(): v for k, v in headers.items()}
    return parse_identity(
        kind, handler, lambda n: [lowered[n.lower()]] if n.lower() in lowered else [], {}
    ).run_id


def test_first_delivery_runs_the_handler_and_records_completion(
    app: flask.Flask, shop: Shop, store: SwitchableStore
) -> None:
    response = deliver(app)
    assert response.status_code == 200
    assert response.headers["X-Tasklease-Outcome"] == "processed"
    assert response.json["result"] == {"receipt_for": 42}
    record = store.get(response.headers["X-Tasklease-Run-Id"])
    assert record is not None
    assert record.status is RunStatus.COMPLETED
    assert record.result == {"receipt_for": 42}


def test_context_carries_the_delivery_and_the_claim(app: flask.Flask, shop: Shop) -> None:
    headers = task_headers(retry=2, execution=1) | {
        "X-CloudTasks-TaskPreviousResponse": "503",
        "X-CloudTasks-TaskRetryReason": "HTTP 503",
        "X-Tasklease-Project": "shop-prod",
    }
    deliver(app, headers)
    ctx = shop.contexts[0]
    assert (ctx.kind, ctx.handler, ctx.queue, ctx.task_name) == (
        "task",
        "send_receipt",
        "default",
        "task-1",
    )
    assert (ctx.retry_count, ctx.execution_count, ctx.previous_response) == (2, 1, 503)
    assert ctx.retry_reason == "HTTP 503"
    assert ctx.project == "shop-prod"
    assert ctx.eta == datetime.fromtimestamp(1_792_152_000.5, tz=UTC)
    assert (ctx.fencing_token, ctx.attempt) == (1, 1)
    assert len(ctx.run_id) == 64 and len(ctx.attempt_id) == 32
    assert ctx.idempotency_key.count("-") == 4  # UUID-shaped, for Google APIs' request_id.
    assert ctx.lease_expires == datetime(2026, 10, 16, 12, 1, tzinfo=UTC)
    assert json.loads(ctx.body) == {"order_id": 42}
    assert not ctx.lease_lost


def test_duplicate_delivery_after_completion_does_not_run_handler(
    app: flask.Flask, shop: Shop
) -> None:
    deliver(app)
    response = deliver(app, task_headers(retry=1, execution=1))
    assert response.status_code == 200
    assert response.headers["X-Tasklease-Outcome"] == "duplicate"
    assert response.json["result"] == {"receipt_for": 42}
    assert shop.calls["send_receipt"] == 1


def test_lowercase_headers_from_http2_front_ends_are_one_run(app: flask.Flask, shop: Shop) -> None:
    deliver(app)
    response = deliver(app, {k.lower(): v for k, v in task_headers().items()})
    assert response.headers["X-Tasklease-Outcome"] == "duplicate"
    assert shop.calls["send_receipt"] == 1


def test_delivery_while_another_attempt_holds_the_lease_gets_409(
    app: flask.Flask, shop: Shop, clock: FakeClock
) -> None:
    nested: list[Any] = []
    shop.behaviour = lambda payload, ctx: nested.append(deliver(app))
    response = deliver(app)
    assert response.status_code == 200
    assert nested[0].status_code == 409
    assert nested[0].headers["X-Tasklease-Outcome"] == "in_progress"
    # Until the lease (60 s) plus the clock-skew bound have passed.
    assert int(nested[0].headers["Retry-After"]) == 60 + c.MAX_CLOCK_SKEW.seconds
    assert shop.calls["send_receipt"] == 1


def test_expired_lease_is_taken_over_with_a_higher_fencing_token(
    app: flask.Flask, shop: Shop, store: SwitchableStore, clock: FakeClock
) -> None:
    run_id = run_id_of(task_headers())
    store.claim(claim_request(run_id, "crashed-attempt"), clock())  # A worker that died.
    assert deliver(app).status_code == 409
    clock.advance(timedelta(minutes=5))
    assert deliver(app).status_code == 409  # Within the clock-skew bound.
    clock.advance(c.MAX_CLOCK_SKEW)
    response = deliver(app)
    assert response.headers["X-Tasklease-Outcome"] == "processed"
    assert shop.contexts[0].fencing_token == 2


def test_permanent_failure_is_recorded_and_stops_the_queue(
    app: flask.Flask, shop: Shop, store: SwitchableStore
) -> None:
    def refuse(payload: Any, ctx: TaskContext) -> None:
        raise PermanentFailure("order 42 does not exist")

    shop.behaviour = refuse
    response = deliver(app)
    assert response.status_code == 200
    assert response.headers["X-Tasklease-Outcome"] == "failed"
    record = store.get(response.headers["X-Tasklease-Run-Id"])
    assert record is not None
    assert record.status is RunStatus.FAILED
    assert record.error == "PermanentFailure: order 42 does not exist"
    assert json.loads(record.payload or "") == {"order_id": 42}
    again = deliver(app)
    assert (again.status_code, again.headers["X-Tasklease-Outcome"]) == (200, "duplicate")
    assert again.json["status"] == "failed"
    assert shop.calls["send_receipt"] == 1


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe\x00garbage", b"[" * 5000 + b"]" * 5000])
def test_payload_that_is_not_json_is_dead_lettered_without_running(
    app: flask.Flask, shop: Shop, store: SwitchableStore, raw: bytes
) -> None:
    response = deliver(app, raw=raw)
    assert response.status_code == 200
    assert response.headers["X-Tasklease-Outcome"] == "failed"
    assert "not valid JSON" in response.json["message"]
    record = store.get(response.headers["X-Tasklease-Run-Id"])
    assert record is not None and record.status is RunStatus.FAILED
    assert record.payload  # Kept, losslessly escaped, for inspection and replay.
    assert shop.calls["send_receipt"] == 0


def test_empty_body_is_a_none_payload(app: flask.Flask, shop: Shop) -> None:
    shop.behaviour = lambda payload, ctx: {"payload": payload}
    assert deliver(app, raw=b"").json["result"] == {"payload": None}


def test_handler_exception_releases_the_claim_for_an_immediate_retry(
    app: flask.Flask, shop: Shop, store: SwitchableStore
) -> None:
    def flaky(payload: Any, ctx: TaskContext) -> str:
        if ctx.attempt == 1:
            raise ConnectionError("mail server down")
        return "sent"

    shop.behaviour = flaky
    first = deliver(app)
    assert (first.status_code, first.headers["X-Tasklease-Outcome"]) == (500, "released")
    record = store.get(first.headers["X-Tasklease-Run-Id"])
    assert record is not None
    assert (record.status, record.error) == (
        RunStatus.RELEASED,
        "ConnectionError: mail server down",
    )
    second = deliver(app, task_headers(retry=1, execution=1))
    assert (second.status_code, second.headers["X-Tasklease-Outcome"]) == (200, "processed")
    assert [ctx.fencing_token for ctx in shop.contexts] == [1, 2]


def test_max_attempts_turns_repeated_failure_into_a_dead_letter(
    app: flask.Flask, shop: Shop
) -> None:
    path = "/tasks/limited"
    outcomes = [deliver(app, path=path).headers["X-Tasklease-Outcome"] for _ in range(4)]
    # The second attempt is the last allowed: its failure is the dead letter.
    assert outcomes == ["released", "failed", "duplicate", "duplicate"]
    assert shop.calls["limited"] == 2


def test_lost_claim_is_not_overwritten_and_answers_409(
    app: flask.Flask, shop: Shop, store: SwitchableStore, clock: FakeClock
) -> None:
    def slow(payload: Any, ctx: TaskContext) -> str:
        clock.advance(timedelta(minutes=2))  # Past the 1-minute lease, with no renewal yet.
        store.claim(claim_request(ctx.run_id, "newer-attempt"), clock())
        return "late"

    shop.behaviour = slow
    response = deliver(app)
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (409, "lost_claim")
    record = store.get(response.headers["X-Tasklease-Run-Id"])
    assert record is not None
    assert (record.attempt_id, record.status) == ("newer-attempt", RunStatus.IN_PROGRESS)


def test_handler_that_checks_its_lease_after_a_takeover_stops_with_409(
    app: flask.Flask, shop: Shop, store: SwitchableStore, clock: FakeClock
) -> None:
    side_effects: list[str] = []

    def careful(payload: Any, ctx: TaskContext) -> None:
        store.claim(claim_request(ctx.run_id, "newer-attempt"), clock() + timedelta(minutes=2))
        # What the lease keeper does to the attempt when a renewal finds the takeover.
        ctx._live.mark_lease_lost()
        ctx.check_lease()
        side_effects.append("should not happen")

    shop.behaviour = careful
    response = deliver(app)
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (409, "lost_claim")
    assert side_effects == []
    record = store.get(response.headers["X-Tasklease-Run-Id"])
    assert record is not None and record.attempt_id == "newer-attempt"


@pytest.mark.parametrize(
    "headers",
    [{}, {"X-CloudTasks-QueueName": "default"}, {"X-CloudTasks-TaskName": "t"}, job_headers()],
)
def test_delivery_without_identity_headers_is_refused_and_claims_nothing(
    app: flask.Flask, shop: Shop, store: SwitchableStore, headers: dict[str, str]
) -> None:
    response = deliver(app, headers)
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (400, "rejected")
    assert "header is missing" in response.json["message"]
    assert store.list_runs() == []
    assert shop.calls["send_receipt"] == 0


def test_unknown_handler_is_404_so_a_newer_deploy_can_take_the_retry(
    app: flask.Flask, store: SwitchableStore
) -> None:
    for path in [
        "/tasks/unknown",
        "/tasks/../jobs/nightly",
        "/tasks/send_receipt/x",
        "/jobs/send_receipt",
    ]:
        response = deliver(app, path=path)
        assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (404, "rejected")
    assert store.list_runs() == []


def test_body_over_the_cloud_tasks_limit_is_413(
    app: flask.Flask, shop: Shop, store: SwitchableStore
) -> None:
    response = deliver(app, raw=b" " * (1024 * 1024 + 1))
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (413, "rejected")
    assert store.list_runs() == []
    assert deliver(app, raw=b'{"order_id": 1}' + b" " * (1024 * 1024 - 15)).status_code == 200


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_methods_other_than_post_are_405(
    app: flask.Flask, store: SwitchableStore, method: str
) -> None:
    response = app.test_client().open("/tasks/send_receipt", method=method, headers=task_headers())
    assert response.status_code == 405
    assert response.headers["Allow"] == "POST"
    assert response.headers["X-Tasklease-Outcome"] == "rejected"
    assert store.list_runs() == []


def test_store_down_at_claim_is_503_with_retry_after_and_runs_nothing(
    app: flask.Flask, shop: Shop, store: SwitchableStore
) -> None:
    store.down = True
    response = deliver(app)
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (503, "unavailable")
    assert response.headers["Retry-After"] == "5"
    assert shop.calls["send_receipt"] == 0
    store.down = False
    assert deliver(app).headers["X-Tasklease-Outcome"] == "processed"


def test_sqlite_file_unreachable_is_503(shop: Shop, tmp_path: Any) -> None:
    (tmp_path / "file").write_text("")
    app = create_app(shop.router, store=f"sqlite:///{tmp_path}/file/runs.db", auth="none")
    response = deliver(app)
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (503, "unavailable")
    assert shop.calls["send_receipt"] == 0


def test_store_down_when_finishing_answers_503_after_retrying(
    app: flask.Flask, shop: Shop, store: SwitchableStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_retries, "FINISH_RETRY_PAUSES", (0.0, 0.0))
    store.down_after_claim = True
    response = deliver(app)
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (503, "unrecorded")
    assert shop.calls["send_receipt"] == 1


def test_scheduled_run_executes_once_across_offsets_and_retries(
    app: flask.Flask, shop: Shop
) -> None:
    first = deliver(app, job_headers(), path="/jobs/nightly", raw=b"")
    assert (first.status_code, first.json["result"]) == (200, "reports sent")
    same_run = job_headers(schedule_time="2026-10-16T05:00:00-07:00")
    assert (
        deliver(app, same_run, path="/jobs/nightly").headers["X-Tasklease-Outcome"] == "duplicate"
    )
    next_run = job_headers(schedule_time="2026-10-17T12:00:00Z")
    assert (
        deliver(app, next_run, path="/jobs/nightly").headers["X-Tasklease-Outcome"] == "processed"
    )
    assert shop.calls["nightly"] == 2
    ctx = shop.contexts[0]
    assert (ctx.kind, ctx.job_name) == ("scheduler", "nightly")
    assert ctx.schedule_time == datetime(2026, 10, 16, 12, tzinfo=UTC)


def test_scheduled_run_without_schedule_time_is_refused(app: flask.Flask, shop: Shop) -> None:
    headers = {"X-CloudScheduler": "true", "X-CloudScheduler-JobName": "nightly"}
    response = deliver(app, headers, path="/jobs/nightly")
    assert response.status_code == 400
    assert "ScheduleTime header is missing" in response.json["message"]
    assert shop.calls["nightly"] == 0


def test_project_and_location_separate_runs_of_the_same_job(app: flask.Flask, shop: Shop) -> None:
    for query in ["", "?project=a&location=us-central1", "?project=b&location=us-central1"]:
        deliver(app, job_headers(), path="/jobs/nightly" + query)
    assert shop.calls["nightly"] == 3


def test_every_request_writes_one_structured_log_line(
    app: flask.Flask, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tasklease")
    deliver(app, task_headers(retry=1, execution=1))
    deliver(app, {})
    lines = [r for r in caplog.records if r.name == "tasklease.execution"]
    assert len(lines) == 2
    fields = lines[0].tasklease  # type: ignore[attr-defined]
    assert fields["handler"] == "send_receipt"
    assert fields["outcome"] == "processed"
    assert fields["queue"] == "default" and fields["task_name"] == "task-1"
    assert (fields["retry_count"], fields["execution_count"], fields["attempt"]) == (1, 1, 1)
    assert len(fields["run_id"]) == 64 and len(fields["attempt_id"]) == 32
    assert fields["duration_ms"] >= 0 and fields["instance"]
    assert lines[1].tasklease["outcome"] == "rejected"  # type: ignore[attr-defined]


def test_turning_auth_off_warns_at_start_up(shop: Shop, caplog: pytest.LogCaptureFixture) -> None:
    create_app(shop.router, store="memory://", auth="none")
    assert any("authentication is OFF" in r.getMessage() for r in caplog.records)


def test_store_url_comes_from_the_environment(
    shop: Shop, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("TASKLEASE_STORE", f"sqlite:///{tmp_path}/env.db")
    monkeypatch.setenv("TASKLEASE_AUTH", "none")
    app = create_app(shop.router)
    assert deliver(app).status_code == 200
    assert (tmp_path / "env.db").exists()


def test_health_check_answers_without_touching_the_store(app: flask.Flask) -> None:
    assert app.test_client().get("/healthz").json == {"status": "ok"}


@pytest.mark.parametrize(
    "result",
    [{1, 2}, {(1, 2): "a"}, float("nan")],
    ids=["set", "tuple-key", "nan"],
)
def test_a_result_json_cannot_encode_is_a_clear_failure_not_a_500(
    app: flask.Flask, shop: Shop, store: SwitchableStore, result: Any
) -> None:
    shop.behaviour = lambda payload, ctx: result
    for _ in range(3):  # The first delivery and every duplicate.
        response = deliver(app)
        assert response.status_code == 200
        assert response.json is not None
        assert "not JSON-serialisable" in (response.json.get("error") or response.json["message"])
    record = store.get(response.headers["X-Tasklease-Run-Id"])
    assert record is not None
    assert record.status is RunStatus.FAILED
    assert shop.calls["send_receipt"] == 1


def test_first_answer_and_every_duplicate_carry_the_same_result_bytes(
    app: flask.Flask, shop: Shop, store: SwitchableStore
) -> None:
    shop.behaviour = lambda payload, ctx: {"z": [1, 2.5, "é"], "a": {"nested": None}}
    first = deliver(app)
    again = deliver(app)
    assert first.headers["X-Tasklease-Outcome"] == "processed"
    assert again.headers["X-Tasklease-Outcome"] == "duplicate"
    stored = store.get(first.headers["X-Tasklease-Run-Id"])
    assert stored is not None
    result_bytes = stored.result_json
    assert result_bytes is not None
    assert f'"result":{result_bytes}}}'.encode() in first.data
    assert f'"result":{result_bytes}}}'.encode() in again.data
    expected = {"a": {"nested": None}, "z": [1, 2.5, "é"]}
    assert first.json["result"] == again.json["result"] == expected


def test_a_manual_run_does_not_consume_the_next_scheduled_run(
    app: flask.Flask, shop: Shop, store: SwitchableStore, clock: FakeClock, caplog: Any
) -> None:
    # `gcloud scheduler jobs run` at 12:00 sends the next slot's time, 13:00 (platform-facts).
    next_slot = "2026-10-16T13:00:00Z"
    caplog.set_level(logging.INFO, logger="tasklease")
    manual = deliver(app, job_headers(schedule_time=next_slot), path="/jobs/nightly")
    assert manual.headers["X-Tasklease-Outcome"] == "processed"
    retried = deliver(app, job_headers(schedule_time=next_slot), path="/jobs/nightly")
    assert retried.headers["X-Tasklease-Outcome"] == "duplicate"  # Its retries stay one run.
    record = store.get(manual.headers["X-Tasklease-Run-Id"])
    assert record is not None
    assert record.identity["trigger"] == "manual"
    lines = [r for r in caplog.records if getattr(r, "tasklease", {}).get("trigger") == "manual"]
    assert lines, "the manual run's log line does not say it was manual"
    clock.advance(timedelta(hours=1))  # The slot itself comes.
    scheduled = deliver(app, job_headers(schedule_time=next_slot), path="/jobs/nightly")
    assert scheduled.headers["X-Tasklease-Outcome"] == "processed"
    assert scheduled.headers["X-Tasklease-Run-Id"] != manual.headers["X-Tasklease-Run-Id"]
    assert shop.calls["nightly"] == 2


def test_manual_run_margin_is_a_router_and_handler_setting(clock: FakeClock) -> None:
    router = Router(manual_run_margin=timedelta(hours=2))
    ran: list[str] = []

    @router.scheduled("hourly")
    def hourly(ctx: TaskContext) -> None:
        ran.append("router")

    @router.scheduled("tight", manual_run_margin=timedelta(seconds=5))
    def tight(ctx: TaskContext) -> None:
        ran.append("tight")

    app = create_app(router, store=MemoryStore(), auth="none", clock=clock)
    early = job_headers(job="hourly", schedule_time="2026-10-16T13:00:00Z")
    run = deliver(app, early, path="/jobs/hourly")
    assert (
        parse_identity(  # Within the router's 2 h margin: the slot's own run.
            Kind.SCHEDULER, "hourly", lambda n: [early[n]] if n in early else [], {}
        ).run_id
        == run.headers["X-Tasklease-Run-Id"]
    )
    tight_headers = job_headers(job="tight", schedule_time="2026-10-16T12:00:10Z")
    tight_run = deliver(app, tight_headers, path="/jobs/tight")
    assert tight_run.headers["X-Tasklease-Outcome"] == "processed"
    assert (
        parse_identity(
            Kind.SCHEDULER, "tight", lambda n: [tight_headers[n]] if n in tight_headers else [], {}
        ).run_id
        != tight_run.headers["X-Tasklease-Run-Id"]
    )


def test_a_claim_that_waited_on_a_locked_sqlite_file_holds_a_fresh_lease(
    tmp_path: Any,
) -> None:
    router = Router()
    nested: list[Any] = []
    runs: list[str] = []
    store = SqliteStore(tmp_path / "runs.db")

    @router.task("brief", lease=timedelta(seconds=1))
    def brief(payload: Any, ctx: TaskContext) -> None:
        runs.append(ctx.attempt_id)
        if len(runs) == 1:  # A retry arriving as soon as the claim is granted.
            nested.append(worker.test_client().post("/tasks/brief", headers=task_headers(retry=1)))

    worker = create_app(router, store=store, auth="none")
    store.get("warm-up")  # Create the file and schema before locking it.
    locker = sqlite3.connect(tmp_path / "runs.db", isolation_level=None, check_same_thread=False)
    locker.execute("BEGIN IMMEDIATE")
    unlock = threading.Timer(2.5, lambda: locker.execute("COMMIT"))  # Longer than lease + skew.
    unlock.start()
    try:
        first = worker.test_client().post("/tasks/brief", headers=task_headers())
    finally:
        unlock.join()
        locker.close()
    assert first.headers["X-Tasklease-Outcome"] == "processed"
    assert nested[0].headers["X-Tasklease-Outcome"] == "in_progress"
    assert len(runs) == 1


@pytest.mark.parametrize("store_url", ["memory://", "sqlite:///runs.db"])
def test_a_local_store_on_cloud_run_refuses_to_start(
    shop: Shop, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, store_url: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("K_SERVICE", "worker")
    monkeypatch.delenv("TASKLEASE_ALLOW_LOCAL_STORE", raising=False)
    with pytest.raises(ConfigurationError, match="TASKLEASE_STORE=firestore"):
        create_app(shop.router, store=store_url, auth="none")
    monkeypatch.setenv("TASKLEASE_ALLOW_LOCAL_STORE", "1")
    assert create_app(shop.router, store=store_url, auth="none")
    monkeypatch.delenv("K_SERVICE")
    monkeypatch.delenv("TASKLEASE_ALLOW_LOCAL_STORE")
    assert create_app(shop.router, store=store_url, auth="none")
