"""A worker in a process with no OpenTelemetry loaded, and one whose providers come late.

Until something imports ``opentelemetry``, the worker does not either: its deliveries read the
caller's trace for their log lines themselves. Each script runs in a fresh interpreter, since
a process imports OpenTelemetry and sets its global providers only once.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tasklease.worker.observe import telemetry
from tests.support.fresh_python import run_python

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"

# Shared by the scripts: a one-handler app, deliveries, and its log lines as Cloud Logging
# reads them.
PRELUDE = """
import json, logging, sys
from tasklease.worker.observe.logs import CloudLoggingFormatter

lines = []

class Keep(logging.Handler):
    def emit(self, record):
        lines.append(json.loads(CloudLoggingFormatter().format(record)))

logging.getLogger("tasklease.execution").addHandler(Keep())

def headers(task, **extra):
    return {
        "X-CloudTasks-QueueName": "q", "X-CloudTasks-TaskName": task,
        "X-CloudTasks-TaskRetryCount": "0", "X-CloudTasks-TaskExecutionCount": "0",
        "X-Tasklease-Project": "shop-prod", **extra,
    }

def out(**values):
    print(json.dumps(values))
"""


def run(script: str) -> dict[str, Any]:
    """Run PRELUDE + ``script`` in a fresh interpreter; the JSON it printed last."""
    code = textwrap.dedent(PRELUDE) + textwrap.dedent(script)
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    value: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return value


def test_without_opentelemetry_a_line_still_names_the_trace_only_once_authenticated() -> None:
    found = run(
        f"""
        from tasklease import MemoryStore, Router, create_app
        from tasklease.worker import Authenticator, AuthResult

        class RefuseUnsigned(Authenticator):
            def authenticate(self, request, spec):
                if request.authorization is None:
                    return AuthResult(401, "no token")
                return AuthResult(200, "allowed", "tests@example.com")

        router = Router()
        router.task("send")(lambda payload, ctx: None)
        client = create_app(router, store=MemoryStore(), auth=RefuseUnsigned()).test_client()
        signed = {{"Authorization": "Bearer x"}}
        answers = [
            client.post("/tasks/send", headers=headers("a", traceparent="{TRACEPARENT}")),
            client.post(
                "/tasks/send", data="{{}}",
                headers=headers("b", traceparent="{TRACEPARENT}", **signed),
            ),
            client.post(
                "/tasks/send", data="{{}}",
                headers=headers("c", **{{"X-Cloud-Trace-Context": "{TRACE_ID}/12345;o=0"}},
                                **signed),
            ),
            client.post("/tasks/send", data="{{}}", headers=headers("d", **signed)),
        ]
        out(
            statuses=[answer.status_code for answer in answers],
            lines=lines,
            otel=sorted(m for m in sys.modules if m.startswith("opentelemetry")),
        )
        """
    )
    assert found["statuses"] == [401, 200, 200, 200]
    assert found["otel"] == []
    refused, traced, cloud_traced, untraced = found["lines"]
    assert "logging.googleapis.com/trace" not in refused
    assert traced["logging.googleapis.com/trace"] == f"projects/shop-prod/traces/{TRACE_ID}"
    assert traced["logging.googleapis.com/spanId"] == "00f067aa0ba902b7"
    assert traced["logging.googleapis.com/trace_sampled"] is True
    assert cloud_traced["logging.googleapis.com/trace"].endswith(TRACE_ID)
    assert cloud_traced["logging.googleapis.com/spanId"] == f"{12345:016x}"
    assert cloud_traced["logging.googleapis.com/trace_sampled"] is False
    assert "logging.googleapis.com/trace" not in untraced
    assert traced["logging.googleapis.com/labels"] == {
        "handler": "send",
        "run_id": traced["run_id"],
    }


def test_a_handler_importing_the_producer_in_its_first_delivery_fans_out_in_its_trace() -> None:
    found = run(
        f"""
        from tasklease import MemoryStore, Router, create_app

        router = Router()
        children = []

        @router.task("split")
        def split(payload, ctx):
            from tasklease import Producer  # Imports OpenTelemetry, mid-delivery.
            from tasklease.producer.memory import MemoryTransport

            transport = MemoryTransport()
            Producer("p", "l", "q", "http://127.0.0.1:1", transport=transport).fan_out(
                ctx, "part", [("1", {{}})]
            )
            children.extend(task.request.headers for task in transport.tasks)

        app = create_app(router, store=MemoryStore(), auth="none")
        loaded_before = "opentelemetry" in sys.modules
        answer = app.test_client().post(
            "/tasks/split", data="{{}}",
            headers=headers("a", traceparent="{TRACEPARENT}", tracestate="vendor=1"),
        )
        out(status=answer.status_code, loaded_before=loaded_before, children=children)
        """
    )
    assert found["status"] == 200 and found["loaded_before"] is False
    [child] = found["children"]
    assert child["traceparent"] == TRACEPARENT
    assert child["tracestate"] == "vendor=1"
    assert child["X-Cloud-Trace-Context"] == f"{TRACE_ID}/{0x00F067AA0BA902B7};o=1"


@pytest.mark.parametrize("when", ["before_create_app", "after_create_app", "after_a_delivery"])
def test_providers_set_around_create_app_record_the_next_deliveries(when: str) -> None:
    found = run(
        f"""
        from tasklease import MemoryStore, Router, create_app

        def configure():
            from opentelemetry import metrics, trace
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter,
            )

            exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
            return exporter, reader

        if "{when}" == "before_create_app":
            exporter, reader = configure()
        router = Router()
        router.task("send")(lambda payload, ctx: None)
        client = create_app(router, store=MemoryStore(), auth="none").test_client()
        if "{when}" == "after_a_delivery":
            client.post("/tasks/send", data="{{}}", headers=headers("early"))
        if "{when}" != "before_create_app":
            exporter, reader = configure()
        answer = client.post(
            "/tasks/send", data="{{}}", headers=headers("a", traceparent="{TRACEPARENT}")
        )
        spans = exporter.get_finished_spans()
        counted = [
            point.value
            for resource in reader.get_metrics_data().resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == "tasklease.deliveries"
            for point in metric.data.data_points
        ]
        [delivery] = [span for span in spans if span.name == "task send"]
        out(
            status=answer.status_code,
            spans=sorted(span.name for span in spans),
            trace_id=f"{{delivery.context.trace_id:032x}}",
            span_id=f"{{delivery.context.span_id:016x}}",
            counted=counted,
            line=lines[-1],
        )
        """
    )
    assert found["status"] == 200
    assert found["spans"] == ["claim", "finish", "handler", "task send"]
    assert found["trace_id"] == TRACE_ID
    assert found["counted"] == [1]
    assert found["line"]["logging.googleapis.com/spanId"] == found["span_id"]


@pytest.mark.parametrize(
    "value",
    [
        TRACEPARENT,
        f"00-{TRACE_ID}-00f067aa0ba902b7-00",
        f" \t00-{TRACE_ID}-00f067aa0ba902b7-01 ",
        f"01-{TRACE_ID}-00f067aa0ba902b7-03-future-fields",
        f"00-{TRACE_ID}-00f067aa0ba902b7-01-extra",
        f"ff-{TRACE_ID}-00f067aa0ba902b7-01",
        f"00-{'0' * 32}-00f067aa0ba902b7-01",
        f"00-{TRACE_ID}-{'0' * 16}-01",
        f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01",
        f"00-{TRACE_ID}-00f067aa0ba902b7",
        f"01-{TRACE_ID}-00f067aa0ba902b7-01-{'x' * 512}",
        "",
    ],
)
def test_the_light_traceparent_reader_agrees_with_opentelemetrys(value: str) -> None:
    theirs = trace.get_current_span(
        TraceContextTextMapPropagator().extract({"traceparent": value})
    ).get_span_context()
    ours = telemetry.parse_traceparent(value)
    if not theirs.is_valid:
        assert ours is None
    else:
        assert ours is not None
        assert (ours.trace_id, ours.span_id, ours.sampled) == (
            theirs.trace_id,
            theirs.span_id,
            theirs.trace_flags.sampled,
        )
