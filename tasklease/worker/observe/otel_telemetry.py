"""The OpenTelemetry half of :mod:`tasklease.worker.observe.telemetry`: deliveries' spans and
metrics.

Imported once anything in the process can use OpenTelemetry. The API alone is still a no-op:
with no SDK configured, a delivery costs a few look-ups here and builds no attributes (they
are set only on a span that records).
"""

from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager, nullcontext
from contextvars import Token
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as _metrics_api
from opentelemetry.trace import (
    INVALID_SPAN,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tasklease.worker.core.outcome import Outcome
from tasklease.worker.observe.delivery_trace import (
    CLOUD_TRACE_HEADER,
    INSTRUMENTATION,
    DeliveryTrace,
    HeaderLookup,
    TraceParent,
    log_fields,
    parse_cloud_trace,
)

# Seconds: deliveries and claims take milliseconds to minutes.
DURATION_BUCKETS: tuple[float, ...] = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1, 2.5, 5, 10, 30, 60, 300, 1800),
)

_W3C = TraceContextTextMapPropagator()
_NO_STEP: AbstractContextManager[Any] = nullcontext()
_OVERLAPS = frozenset({Outcome.SKIPPED_OVERLAP, Outcome.KEY_BUSY})


class _Instruments:
    """The worker's metric instruments, made from one meter."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.deliveries = meter.create_counter(
            "tasklease.deliveries",
            unit="{delivery}",
            description="Deliveries answered, by handler, kind and outcome.",
        )
        self.duration = meter.create_histogram(
            "tasklease.delivery.duration",
            unit="s",
            description="Time from a delivery's arrival to its answer.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.claim_duration = meter.create_histogram(
            "tasklease.claim.duration",
            unit="s",
            description="Time the lease store took to answer a claim.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.renewals = meter.create_counter(
            "tasklease.lease.renewals",
            unit="{renewal}",
            description="Lease renewals, by result (renewed, failed).",
        )
        self.leases_lost = meter.create_counter(
            "tasklease.lease.lost",
            unit="{lease}",
            description="Attempts that lost their lease while the handler ran.",
        )
        self.overlaps_skipped = meter.create_counter(
            "tasklease.overlaps_skipped",
            unit="{delivery}",
            description="Runs not started because another run held the job's or key's lock.",
        )


_tracer: trace.Tracer = trace.get_tracer(INSTRUMENTATION)
_instruments = _Instruments(metrics.get_meter(INSTRUMENTATION))
# While no global provider is set, a delivery skips the telemetry calls. The API's public
# getters read os.environ on every call until one is set (about 1 us a delivery each, on a
# path bench/worker_throughput.py measures in tens of us); the API's own globals say the
# same for free. Should they ever be renamed, getattr's default keeps telemetry on.
_UNKNOWN = object()
_ENV_PROVIDERS = (
    "OTEL_PYTHON_TRACER_PROVIDER" in os.environ,
    "OTEL_PYTHON_METER_PROVIDER" in os.environ,
)
_explicit = [False, False]  # use_providers() gave a tracer provider, a meter provider.


def use_providers(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> None:
    """See :func:`tasklease.worker.observe.telemetry.use_providers`."""
    global _tracer, _instruments  # noqa: PLW0603 - one tracer and meter per process.
    _tracer = trace.get_tracer(INSTRUMENTATION, tracer_provider=tracer_provider)
    _instruments = _Instruments(metrics.get_meter(INSTRUMENTATION, meter_provider=meter_provider))
    _explicit[:] = [tracer_provider is not None, meter_provider is not None]


def _tracing() -> bool:
    return (
        _explicit[0]
        or getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is not None
        or _ENV_PROVIDERS[0]
    )


def _metering() -> bool:
    return (
        _explicit[1]
        or getattr(_metrics_api, "_METER_PROVIDER", _UNKNOWN) is not None
        or _ENV_PROVIDERS[1]
    )


def incoming_context(header: HeaderLookup) -> SpanContext | None:
    """The caller's span context: W3C ``traceparent`` (with ``tracestate``), else
    ``X-Cloud-Trace-Context``. None if neither is present and valid."""
    traceparent = header("traceparent")
    if traceparent:
        carrier = {"traceparent": traceparent[0]}
        tracestate = header("tracestate")
        if tracestate:
            carrier["tracestate"] = tracestate[0]
        found = trace.get_current_span(_W3C.extract(carrier)).get_span_context()
        if found.is_valid:
            return found
    cloud = header(CLOUD_TRACE_HEADER)
    caller = parse_cloud_trace(cloud[0]) if cloud else None
    if caller is None:
        return None
    flags = TraceFlags(TraceFlags.SAMPLED if caller.sampled else TraceFlags.DEFAULT)
    return SpanContext(caller.trace_id, caller.span_id, is_remote=True, trace_flags=flags)


class OtelDeliveryTrace(DeliveryTrace):
    """One delivery's span (recording or not), current while the delivery is served.

    The span starts in the caller's trace once the request is authenticated; a refused
    request's span starts a trace of its own.
    """

    __slots__ = ("_recording", "_start_ns", "_token", "metering", "span")

    def __init__(self, header: HeaderLookup, kind: str, label: str) -> None:
        super().__init__(header, kind, label, span_context=incoming_context)
        self.metering = _metering()
        self._recording = False
        self._token: Token[otel_context.Context] | None = None
        self._start_ns: int | None = time.time_ns()  # None once the span is started.
        self.span: trace.Span = INVALID_SPAN

    def trusted(self) -> None:
        """The request is authenticated: start the span in the caller's trace."""
        self._start(incoming_context(self.header), trusted=True)

    def caller(self) -> TraceParent | None:
        return None  # The span in the caller's trace is current: propagation finds it.

    def _start(self, parent: SpanContext | None, *, trusted: bool) -> None:
        start_ns = self._start_ns
        if start_ns is None:
            return
        self._start_ns = None
        if _tracing():
            context: otel_context.Context | None
            if parent is not None:
                context = trace.set_span_in_context(NonRecordingSpan(parent))
            else:  # Trusted: the application's current span, if any; else a new trace.
                context = None if trusted else otel_context.Context()
            self.span = _tracer.start_span(
                f"{self.kind} {self.label}", context, kind=SpanKind.CONSUMER, start_time=start_ns
            )
            self._recording = self.span.is_recording()
        elif parent is not None:
            self.span = NonRecordingSpan(parent)
        # Current only when it carries a trace: then a fan-out from the handler propagates it.
        if self.span is not INVALID_SPAN:
            self._token = otel_context.attach(trace.set_span_in_context(self.span))

    def step(self, name: str) -> AbstractContextManager[Any]:
        """A child span of the delivery span, if that one records."""
        if not self._recording:
            return _NO_STEP
        return _tracer.start_as_current_span(name)

    def claim_step(self) -> AbstractContextManager[Any]:
        if not self._recording and not self.metering:
            return _NO_STEP
        return _ClaimStep(self.step("claim"))

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._start(None, trusted=False)  # Not started: refused before authentication.
        if error is not None and not self._ended:  # A bug: the WSGI layer answers 500 error.
            if self.metering:
                attributes = {"handler": self.label, "kind": self.kind, "outcome": "error"}
                _instruments.deliveries.add(1, attributes)
            if self.span.is_recording():
                self.span.record_exception(error)
                self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self._end()

    def finished(self, status: int, outcome: Outcome, log: dict[str, Any], seconds: float) -> None:
        """Count the delivery, finish its span, and add the trace fields to its log line."""
        self._start(None, trusted=False)  # Not started: refused before authentication.
        if self.metering:
            attributes = {"handler": self.label, "kind": self.kind, "outcome": outcome.value}
            _instruments.deliveries.add(1, attributes)
            _instruments.duration.record(seconds, attributes)
            if outcome in _OVERLAPS:
                _instruments.overlaps_skipped.add(1, attributes)
        span = self.span
        if span.is_recording():
            span.set_attributes(
                {
                    f"tasklease.{name}": log[name]
                    for name in (
                        *("run_id", "attempt", "fencing_token"),
                        *("queue", "job_name", "held_by"),
                    )
                    if log.get(name) is not None
                }
                | {
                    "tasklease.handler": self.label,
                    "tasklease.kind": self.kind,
                    "tasklease.outcome": outcome.value,
                    "http.response.status_code": status,
                }
            )
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR, outcome.value))
        found = span.get_span_context()
        caller = TraceParent(found.trace_id, found.span_id, found.trace_flags.sampled)
        log_fields(caller if found.is_valid else None, log)
        self._end()

    def _end(self) -> None:
        if self._ended:
            return
        self.span.end()
        if self._token is not None:
            otel_context.detach(self._token)
        super()._end()


class _ClaimStep:
    __slots__ = ("_started", "_step")

    def __init__(self, step: AbstractContextManager[Any]) -> None:
        self._step = step

    def __enter__(self) -> None:
        self._step.__enter__()
        self._started = time.monotonic()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _instruments.claim_duration.record(time.monotonic() - self._started)
        self._step.__exit__(kind, error, tb)


def lease_renewed(handler: str, renewed: bool) -> None:
    _instruments.renewals.add(1, {"handler": handler, "result": "renewed" if renewed else "failed"})


def lease_lost(handler: str) -> None:
    _instruments.leases_lost.add(1, {"handler": handler})
