"""Trace context for the tasks a producer creates, through the OpenTelemetry API.

Every task carries the context current when it was enqueued: W3C ``traceparent`` (and
``tracestate``, through the global propagator, so ``OTEL_PROPAGATORS`` applies) and Cloud
Run's ``X-Cloud-Trace-Context``. Cloud Tasks delivers a task's headers as they were set, so
the worker's delivery span joins the enqueuing trace; a fan-out from a handler runs inside
that delivery's span, so its children join it too. With no span current (no SDK, no incoming
trace), nothing is added.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import metrics, propagate, trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanKind

from tasklease.plumbing import joined_trace

if TYPE_CHECKING:
    from tasklease.producer.results import EnqueueResult

INSTRUMENTATION = "tasklease.producer"
CLOUD_TRACE_HEADER = "X-Cloud-Trace-Context"


class _Instruments:
    def __init__(self, meter: metrics.Meter) -> None:
        self.children = meter.create_counter(
            "tasklease.fanout.children",
            unit="{task}",
            description="Fan-out children by result: created, or absorbed (the name existed).",
        )


_tracer: trace.Tracer = trace.get_tracer(INSTRUMENTATION)
_instruments = _Instruments(metrics.get_meter(INSTRUMENTATION))


def use_providers(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> None:
    """Send the producer's spans and metrics to these providers (None: the global ones)."""
    global _tracer, _instruments  # noqa: PLW0603 - one tracer and meter per process.
    _tracer = trace.get_tracer(INSTRUMENTATION, tracer_provider=tracer_provider)
    _instruments = _Instruments(metrics.get_meter(INSTRUMENTATION, meter_provider=meter_provider))


def trace_headers() -> dict[str, str]:
    """The current trace context as task headers; empty when no trace is current."""
    headers: dict[str, str] = {}
    current = None
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        # A delivery that started before anything imported OpenTelemetry (this module, say,
        # imported by its handler) joined its caller's trace without making it current.
        joined = joined_trace.joined_context()
        if joined is None:
            return headers
        span_context = joined
        current = trace.set_span_in_context(NonRecordingSpan(joined))
    propagate.inject(headers, current)
    sampled = 1 if span_context.trace_flags.sampled else 0
    headers[CLOUD_TRACE_HEADER] = f"{span_context.trace_id:032x}/{span_context.span_id};o={sampled}"
    return headers


@contextmanager
def enqueue_span(task_name: str, queue_path: str) -> Iterator[Span]:
    """The span of one enqueue call (one task or many), current while its tasks are built."""
    with _tracer.start_as_current_span(f"enqueue {task_name}", kind=SpanKind.PRODUCER) as span:
        if span.is_recording():
            span.set_attributes(
                {"tasklease.task_name": task_name, "messaging.destination.name": queue_path}
            )
        yield span


def enqueued(span: Span, results: Sequence[EnqueueResult]) -> None:
    """Note on ``span`` how many tasks were created, absorbed as duplicates, or failed."""
    if span.is_recording():
        span.set_attributes(
            {
                "tasklease.tasks": len(results),
                "tasklease.created": sum(1 for result in results if result.created),
                "tasklease.absorbed": sum(1 for r in results if r.ok and not r.created),
                "tasklease.failed": sum(1 for result in results if not result.ok),
            }
        )


def fan_out_children(task_name: str, results: Sequence[EnqueueResult]) -> None:
    """Count a fan-out's children: created, or absorbed (a retried run's, already there)."""
    created = sum(1 for result in results if result.created)
    absorbed = sum(1 for result in results if result.ok and not result.created)
    if created:
        _instruments.children.add(created, {"task_name": task_name, "result": "created"})
    if absorbed:
        _instruments.children.add(absorbed, {"task_name": task_name, "result": "absorbed"})
