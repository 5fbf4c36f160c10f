"""Traces, metrics and log correlation of deliveries, with OpenTelemetry's
in-memory span exporter and metric reader standing in for Cloud Trace and Cloud Monitoring."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import flask
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from werkzeug.serving import make_server

from tasklease.emulator import CloudTasksEmulator
from tasklease.producer import Producer, tracing
from tasklease.producer.memory import MemoryTransport
from tasklease.worker import (
    Authenticator,
    AuthRequest,
    AuthResult,
    HandlerSpec,
    PermanentFailure,
    Router,
    TaskContext,
    create_app,
)
from tasklease.worker.delivery.lease import LeaseKeeper
from tasklease.worker.handlers.attempt import Attempt
from tasklease.worker.observe import telemetry
from tasklease.worker.observe.logs import CloudLoggingFormatter
from tasklease.worker.stores import MemoryStore
from tasklease.worker.stores.base import retries as store_retries
from tests.support.helpers import (
    T0,
    FakeClock,
    SwitchableStore,
    claim_request,
    job_headers,
    task_headers,
    wait_for,
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class Telemetry:
    """In-memory OpenTelemetry providers that tasklease's worker and producer report to."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        if data is None:  # Nothing recorded yet.
            return []
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    providers = Telemetry()
    for module in (telemetry, tracing):
        module.use_providers(providers.tracer_provider, providers.meter_provider)
    yield providers
    for module in (telemetry, tracing):
        module.use_providers()
    providers.tracer_provider.shutdown()
    providers.meter_provider.shutdown()


class HeaderAuth(Authenticator):
    """Refuses with 401 or 403 when the test says so in the Authorization header."""

    CALLER = "tests@example.com"

    def authenticate(self, request: AuthRequest, spec: HandlerSpec) -> AuthResult:
        if request.authorization in ("401", "403"):
            return AuthResult(int(request.authorization), "refused by the test")
        return AuthResult(200, "allowed", self.CALLER)


def execution_entries(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    formatter = CloudLoggingFormatter()
    return [
        json.loads(formatter.format(record))
        for record in caplog.records
        if record.name == "tasklease.execution"
    ]


def test_one_trace_spans_enqueue_delivery_and_fan_out_children(otel: Telemetry) -> None:
    parents, children = MemoryTransport(), MemoryTransport()
    router = Router()

    @router.task("split")
    def split(payload: Any, ctx: TaskContext) -> None:
        fan_out = Producer("p", "l", "q", "http://127.0.0.1:1", transport=children)
        fan_out.fan_out(ctx, "part", [(str(n), {"n": n}) for n in range(3)])

    @router.task("part")
    def part(payload: Any, ctx: TaskContext) -> None:
        return None

    app = create_app(router, store=MemoryStore(), auth="none")
    post = app.test_client().post
    producer = Producer("p", "l", "q", "http://127.0.0.1:1", transport=parents)
    with otel.tracer_provider.get_tracer("test").start_as_current_span("request"):
        producer.enqueue("split", {"order": 1}, key="order-1")
    assert parents.tasks[0].request.headers["traceparent"].startswith("00-")
    assert parents.deliver(parents.tasks[0], post, "q") == 200
    assert [children.deliver(task, post, "q") for task in children.tasks] == [200] * 3

    spans = otel.spans()
    by_name = {span.name: span for span in spans}
    assert {span.context.trace_id for span in spans} == {by_name["request"].context.trace_id}
    delivery = by_name["task split"]
    assert delivery.parent is not None
    assert delivery.parent.span_id == by_name["enqueue split"].context.span_id
    handler = next(s for s in spans if s.name == "handler" and s.parent == delivery.context)
    assert by_name["enqueue part"].parent.span_id == handler.context.span_id  # type: ignore[union-attr]
    parts = [span for span in spans if span.name == "task part"]
    assert len(parts) == 3
    assert {span.parent.span_id for span in parts} == {by_name["enqueue part"].context.span_id}  # type: ignore[union-attr]
    steps = [span.name for span in spans if span.parent == delivery.context]
    assert steps == ["claim", "handler", "finish"]
    assert delivery.attributes is not None
    assert delivery.attributes["tasklease.outcome"] == "processed"
    assert delivery.attributes["tasklease.fencing_token"] == 1
    assert delivery.attributes["tasklease.attempt"] == 1
    assert delivery.attributes["tasklease.run_id"]
    created = otel.points("tasklease.fanout.children")
    assert [(p.attributes["result"], p.value) for p in created] == [("created", 3)]


def test_outcome_counters_match_a_scripted_run_of_every_outcome(
    otel: Telemetry, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_retries, "FINISH_RETRY_PAUSES", (0.0,))
    store = SwitchableStore(MemoryStore())
    router = Router()
    nested: list[int] = []

    @router.task("work", lease=timedelta(minutes=1))
    def work(payload: Any, ctx: TaskContext) -> Any:
        mode = payload["mode"]
        if mode == "nest":
            nested.append(deliver("nest", task="t-nest").status_code)
        elif mode == "permanent":
            raise PermanentFailure("no such customer")
        elif mode == "raise":
            raise RuntimeError("try again")
        elif mode == "lost":
            clock.advance(timedelta(minutes=2))
            store.claim(claim_request(ctx.run_id, "newer", caller=HeaderAuth.CALLER), clock())
        elif mode == "unrecorded":
            store.down = True
        return mode

    @router.task("keyed", concurrency_key=lambda payload: "one-key")
    def keyed(payload: Any, ctx: TaskContext) -> None:
        if payload["mode"] == "hold":  # Another task of the key, while this one runs.
            nested.append(deliver("other", task="t-other", path="/tasks/keyed").status_code)

    @router.scheduled("nightly", exclusive=True, max_runtime=timedelta(minutes=10))
    def nightly(ctx: TaskContext) -> None:
        if ctx.schedule_time == T0:  # Another run of the job, while this one runs.
            slot = job_headers(schedule_time="2026-10-16T11:30:00Z")
            nested.append(client.post("/jobs/nightly", headers=slot).status_code)

    client = create_app(router, store=store, auth=HeaderAuth(), clock=clock).test_client()

    def deliver(
        mode: str,
        task: str | None = None,
        path: str = "/tasks/work",
        *,
        retry: int = 0,
        **headers: str,
    ) -> Any:
        return client.post(
            path,
            headers=task_headers(task=task or f"t-{mode}", retry=retry) | headers,
            data=json.dumps({"mode": mode}),
        )

    script = ["ok", "ok", "nest", "permanent", "raise"]
    answers = [deliver(mode).headers["X-Tasklease-Outcome"] for mode in script]
    answers.append(deliver("hold", path="/tasks/keyed").headers["X-Tasklease-Outcome"])
    answers.append(
        client.post("/jobs/nightly", headers=job_headers()).headers["X-Tasklease-Outcome"]
    )
    answers += [deliver(mode).headers["X-Tasklease-Outcome"] for mode in ["lost", "unrecorded"]]
    store.down = True
    answers.append(deliver("down").headers["X-Tasklease-Outcome"])
    store.down = False
    answers.append(deliver("ok", path="/tasks/nowhere").headers["X-Tasklease-Outcome"])
    answers += [
        deliver("ok", Authorization=code).headers["X-Tasklease-Outcome"] for code in ("401", "403")
    ]
    monkeypatch.setattr(store, "get", lambda run_id: 1 / 0)  # A bug in a store.
    answers.append(deliver("ok", retry=1).headers["X-Tasklease-Outcome"])
    expected = [
        "processed", "duplicate", "processed", "failed", "released", "processed", "processed",
        "lost_claim", "unrecorded", "unavailable", "rejected", "unauthenticated", "forbidden",
        "error",
    ]  # fmt: skip
    assert answers == expected
    assert nested == [409, 409, 200]  # in_progress, key_busy, skipped_overlap

    counted = Counter(
        {
            (p.attributes["handler"], p.attributes["outcome"]): p.value
            for p in otel.points("tasklease.deliveries")
        }
    )
    answered = Counter(("work", outcome) for outcome in [*expected, "in_progress"])
    answered[("work", "rejected")] -= 1
    answered[(telemetry.UNKNOWN_HANDLER, "rejected")] += 1
    answered[("work", "processed")] -= 2
    answered.update([("keyed", "processed"), ("keyed", "key_busy")])
    answered.update([("nightly", "processed"), ("nightly", "skipped_overlap")])
    assert counted == +answered
    durations = otel.points("tasklease.delivery.duration")
    answers_with_duration = answered.total() - 1  # The crash has none.
    assert sum(point.count for point in durations) == answers_with_duration
    overlaps = {
        (p.attributes["handler"], p.attributes["outcome"]): p.value
        for p in otel.points("tasklease.overlaps_skipped")
    }
    assert overlaps == {("keyed", "key_busy"): 1, ("nightly", "skipped_overlap"): 1}
    claims = otel.points("tasklease.claim.duration")
    assert sum(point.count for point in claims) == 13  # Each that reached the store's claim.


def test_log_line_carries_cloud_loggings_trace_fields_without_an_sdk(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    caplog.set_level(logging.INFO, logger="tasklease")
    app = _one_handler_app()
    headers = task_headers() | {"X-Tasklease-Project": "shop-prod", "traceparent": TRACEPARENT}
    assert app.test_client().post("/tasks/send", headers=headers, data="{}").status_code == 200
    [entry] = execution_entries(caplog)
    assert entry["logging.googleapis.com/trace"] == f"projects/shop-prod/traces/{TRACE_ID}"
    assert entry["logging.googleapis.com/spanId"] == "00f067aa0ba902b7"
    assert entry["logging.googleapis.com/trace_sampled"] is True
    assert entry["logging.googleapis.com/labels"] == {
        "handler": "send",
        "run_id": entry["run_id"],
    }


def test_cloud_run_trace_header_is_read_when_there_is_no_traceparent(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "worker-project")
    caplog.set_level(logging.INFO, logger="tasklease")
    headers = task_headers() | {"X-Cloud-Trace-Context": f"{TRACE_ID}/12345;o=0"}
    _one_handler_app().test_client().post("/tasks/send", headers=headers, data="{}")
    [entry] = execution_entries(caplog)
    assert entry["logging.googleapis.com/trace"] == f"projects/worker-project/traces/{TRACE_ID}"
    assert entry["logging.googleapis.com/spanId"] == f"{12345:016x}"
    assert entry["logging.googleapis.com/trace_sampled"] is False


def test_log_line_names_the_delivery_span_when_tracing_records(
    otel: Telemetry, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "worker-project")
    caplog.set_level(logging.INFO, logger="tasklease")
    headers = task_headers(traceparent=TRACEPARENT)
    _one_handler_app().test_client().post("/tasks/send", headers=headers, data="{}")
    [entry] = execution_entries(caplog)
    [delivery] = [span for span in otel.spans() if span.name == "task send"]
    assert entry["logging.googleapis.com/spanId"] == f"{delivery.context.span_id:016x}"
    assert re.fullmatch(r"[0-9a-f]{16}", entry["logging.googleapis.com/spanId"])
    assert entry["logging.googleapis.com/trace"].endswith(TRACE_ID)


def test_a_refused_request_starts_a_trace_of_its_own_not_the_one_its_traceparent_names(
    otel: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    """``traceparent`` is anyone's to send: only an authenticated delivery joins that trace."""
    caplog.set_level(logging.INFO, logger="tasklease")
    router = Router()
    router.task("send")(lambda payload, ctx: None)
    client = create_app(router, store=MemoryStore(), auth=HeaderAuth()).test_client()
    headers = task_headers(traceparent=TRACEPARENT)
    for code in ("401", "403"):
        response = client.post("/tasks/send", headers={**headers, "Authorization": code})
        assert response.status_code == int(code)
    assert client.post("/tasks/send", headers=headers, data="{}").status_code == 200
    refused_401, refused_403, allowed = execution_entries(caplog)
    for refused in (refused_401, refused_403):
        assert TRACE_ID not in refused["logging.googleapis.com/trace"]
    assert allowed["logging.googleapis.com/trace"].endswith(TRACE_ID)
    deliveries = [span for span in otel.spans() if span.name == "task send"]
    assert [f"{span.context.trace_id:032x}" == TRACE_ID for span in deliveries] == [
        False,
        False,
        True,
    ]
    assert [span.parent is None for span in deliveries] == [True, True, False]


def test_line_without_a_trace_has_labels_but_no_trace_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tasklease")
    _one_handler_app().test_client().post("/tasks/send", headers=task_headers(), data="{}")
    [entry] = execution_entries(caplog)
    assert "logging.googleapis.com/trace" not in entry
    assert entry["logging.googleapis.com/labels"]["handler"] == "send"


@pytest.mark.parametrize(
    "value",
    [
        f"{TRACE_ID}/0;o=1",
        f"{'0' * 32}/1;o=1",
        f"{TRACE_ID}/1_0;o=1",
        f"{TRACE_ID[:-1]}/1;o=1",
        f"{TRACE_ID}/{2**64};o=1",
        f"{TRACE_ID}/\u0661;o=1",
        "",
    ],
)
def test_malformed_cloud_trace_headers_are_ignored(value: str) -> None:
    assert telemetry.parse_cloud_trace(value) is None


def test_producer_adds_no_trace_headers_when_no_trace_is_current() -> None:
    transport = MemoryTransport()
    Producer("p", "l", "q", "http://127.0.0.1:1", transport=transport).enqueue("t", {})
    headers = transport.tasks[0].request.headers
    assert "traceparent" not in headers and "X-Cloud-Trace-Context" not in headers


def _one_handler_app() -> flask.Flask:
    router = Router()

    @router.task("send")
    def send(payload: Any, ctx: TaskContext) -> None:
        return None

    return create_app(router, store=MemoryStore(), auth="none")


def test_without_an_sdk_fan_out_children_still_carry_the_incoming_trace() -> None:
    children = MemoryTransport()
    router = Router()

    @router.task("split")
    def split(payload: Any, ctx: TaskContext) -> None:
        producer = Producer("p", "l", "q", "http://127.0.0.1:1", transport=children)
        producer.fan_out(ctx, "part", [("1", {})])

    app = create_app(router, store=MemoryStore(), auth="none")
    headers = task_headers(traceparent=TRACEPARENT)
    assert app.test_client().post("/tasks/split", headers=headers, data="{}").status_code == 200
    [child] = children.tasks
    assert child.request.headers["traceparent"] == TRACEPARENT
    assert child.request.headers["X-Cloud-Trace-Context"] == f"{TRACE_ID}/{0x00F067AA0BA902B7};o=1"


def test_lease_renewals_and_a_lost_lease_are_counted(otel: Telemetry) -> None:
    store = MemoryStore()
    lease = timedelta(seconds=1.5)
    record = store.claim(claim_request("run-1", lease=lease), datetime.now(UTC)).record
    ctx = Attempt("task", "h", "run-1", "attempt-1", record.lease_expires)
    ctx.confirm_lease(record.lease_expires, time.monotonic() + lease.total_seconds())
    keeper = LeaseKeeper(store, lambda: datetime.now(UTC))

    def renewals() -> dict[str, int]:
        return {p.attributes["result"]: p.value for p in otel.points("tasklease.lease.renewals")}

    with keeper.kept(ctx, lease):
        assert wait_for(lambda: renewals().get("renewed", 0) >= 1)
        later = datetime.now(UTC) + lease + timedelta(seconds=60)
        store.claim(claim_request("run-1", "attempt-2", lease=lease), later)  # A takeover.
        assert wait_for(lambda: ctx.lease_lost)
    [lost] = otel.points("tasklease.lease.lost")
    assert (lost.attributes, lost.value) == ({"handler": "h"}, 1)


def test_the_trace_survives_the_cloud_tasks_api_and_the_emulators_dispatch(
    otel: Telemetry,
) -> None:
    queue = "projects/p/locations/us-central1/queues/traced"
    with CloudTasksEmulator() as emulator:
        emulator.create_queue(queue, retryConfig={"minBackoff": "0.05s"})
        router = Router()
        server = make_server("127.0.0.1", 0, flask.Flask("placeholder"), threaded=True)
        worker_url = f"http://127.0.0.1:{server.server_port}"
        producer = Producer("p", "us-central1", "traced", worker_url, tasks_endpoint=emulator.url)

        @router.task("split")
        def split(payload: Any, ctx: TaskContext) -> None:
            producer.fan_out(ctx, "part", [("a", {}), ("b", {})])

        @router.task("part")
        def part(payload: Any, ctx: TaskContext) -> None:
            return None

        server.app = create_app(router, store=MemoryStore(), auth="none")
        serving = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        serving.start()
        try:
            with otel.tracer_provider.get_tracer("test").start_as_current_span("request") as root:
                producer.enqueue("split", {}, key="order-7")
            emulator.join(timeout=30)
            outcomes = [delivery.outcome for delivery in emulator.deliveries()]
        finally:
            server.shutdown()
            server.server_close()
            producer.close()
    assert outcomes == ["processed"] * 3
    names = Counter(span.name for span in otel.spans())
    assert names["task split"] == 1 and names["task part"] == 2 and names["enqueue part"] == 1
    assert {span.context.trace_id for span in otel.spans()} == {root.get_span_context().trace_id}
