"""Traces and metrics of each delivery, through the OpenTelemetry API.

The API alone is a no-op: with no SDK configured, a delivery costs a few look-ups here and
builds no attributes (they are set only on a span that records). With an SDK (see
:mod:`tasklease.plumbing.otel_setup`, or the application's own) each delivery gets a span named
``task <handler>`` or ``job <handler>`` with child spans ``claim``, ``handler`` and ``finish``,
and these metrics:

- ``tasklease.deliveries`` (handler, kind, outcome) and ``tasklease.delivery.duration``;
- ``tasklease.claim.duration``: how long the lease store took to answer a claim;
- ``tasklease.lease.renewals`` (result) and ``tasklease.lease.lost``;
- ``tasklease.overlaps_skipped`` (outcome): runs not started because another run held their
  lock: an exclusive job's (``skipped_overlap``) or a concurrency key's (``key_busy``).

The delivery span is a *child* of the context the producer put into the task's headers (W3C
``traceparent``, else Cloud Run's ``X-Cloud-Trace-Context``), not the root of a new trace
linked to it: Cloud Run writes its own request log under the incoming trace id, so a child
keeps that request log, the delivery's log line, every retry of it and the tasks its handler
fans out in the one trace an operator opens from Cloud Logging. Retries show as sibling
delivery spans under the enqueue span.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar, Token
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

INSTRUMENTATION = "tasklease.worker"
CLOUD_TRACE_HEADER = "X-Cloud-Trace-Context"
# The structured-logging fields Cloud Logging reads to group a line under its trace
# (https://cloud.google.com/logging/docs/structured-logging#special-payload-fields).
TRACE_FIELD = "logging.googleapis.com/trace"
SPAN_ID_FIELD = "logging.googleapis.com/spanId"
SAMPLED_FIELD = "logging.googleapis.com/trace_sampled"
LABELS_FIELD = "logging.googleapis.com/labels"
UNKNOWN_HANDLER = "(unknown)"  # The metric label of a handler name no route has.
# Seconds: deliveries and claims take milliseconds to minutes.
DURATION_BUCKETS: tuple[float, ...] = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1, 2.5, 5, 10, 30, 60, 300, 1800),
)

# Cloud Run's header: a 32-hex trace id, a decimal span id, ``o=1`` when sampled.
_CLOUD_TRACE = re.compile(r"([0-9a-fA-F]{32})/([0-9]{1,20})(?:;o=([0-9]+))?")
_W3C = TraceContextTextMapPropagator()
_NO_STEP: AbstractContextManager[Any] = nullcontext()
_OVERLAPS = frozenset({Outcome.SKIPPED_OVERLAP, Outcome.KEY_BUSY})

HeaderLookup = Callable[[str], Sequence[str]]


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
# Whether the current delivery's span records: its steps are spanned only then.
_RECORDING: ContextVar[bool] = ContextVar("tasklease_span_recording", default=False)
# The delivery being served, for :func:`authenticated`.
_DELIVERY: ContextVar[DeliveryTrace | None] = ContextVar("tasklease_delivery", default=None)


def use_providers(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> None:
    """Send the worker's spans and metrics to these providers (None: the global ones, the
    default). For tests, and applications that keep their providers out of the global API."""
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
    return parse_cloud_trace(cloud[0]) if cloud else None


def parse_cloud_trace(value: str) -> SpanContext | None:
    """``TRACE_ID/SPAN_ID;o=1`` as a span context; None if malformed or all zeros."""
    match = _CLOUD_TRACE.fullmatch(value.strip())
    if match is None:
        return None
    trace_id, span_id = int(match[1], 16), int(match[2])
    if not trace_id or not 0 < span_id < 2**64:
        return None
    sampled = match[3] is not None and int(match[3]) & 1
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)


class DeliveryTrace:
    """One delivery's span (recording or not), current while the delivery is served.

    ``label`` names the handler in metrics and the span name: only registered names, so a
    caller cannot grow the metrics' label sets by inventing paths. The span joins the
    caller's trace only once the request is authenticated (:func:`authenticated`): until
    then ``traceparent`` is anyone's to choose, and a refused request's log line and span
    start a trace of their own rather than land in one a stranger named.
    """

    __slots__ = (
        *("_delivery", "_ended", "_parent", "_recording", "_start_ns", "_token"),
        *("kind", "label", "metering", "span"),
    )

    def __init__(self, header: HeaderLookup, kind: str, label: str) -> None:
        self.kind = kind
        self.label = label
        self.metering = _metering()
        self._ended = False
        self._recording: Token[bool] | None = None
        self._token: Token[otel_context.Context] | None = None
        self._parent = incoming_context(header)
        self._start_ns: int | None = time.time_ns()  # None once the span is started.
        self.span: trace.Span = INVALID_SPAN
        self._delivery = _DELIVERY.set(self)

    def trusted(self) -> None:
        """The request is authenticated: start the span in the caller's trace."""
        self._start(self._parent, trusted=True)

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
            if self.span.is_recording():
                self._recording = _RECORDING.set(True)
        elif parent is not None:
            self.span = NonRecordingSpan(parent)
        # Current only when it carries a trace: then a fan-out from the handler propagates it.
        if self.span is not INVALID_SPAN:
            self._token = otel_context.attach(trace.set_span_in_context(self.span))

    def __enter__(self) -> DeliveryTrace:
        return self

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
        log_fields(span.get_span_context(), log)
        self._end()

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self.span.end()
        if self._recording is not None:
            _RECORDING.reset(self._recording)
        if self._token is not None:
            otel_context.detach(self._token)
        _DELIVERY.reset(self._delivery)


def authenticated() -> None:
    """The current delivery's request is authenticated: its span joins the caller's trace."""
    delivery = _DELIVERY.get()
    if delivery is not None:
        delivery.trusted()


def log_fields(span_context: SpanContext, log: dict[str, Any]) -> None:
    """Add Cloud Logging's trace fields (when a trace is known) and labels to ``log``.

    The trace is ``projects/PROJECT/traces/TRACE_ID``, PROJECT from ``GOOGLE_CLOUD_PROJECT``
    or else the delivery's project; with neither, the bare trace id.
    """
    if span_context.is_valid:
        project = os.environ.get("GOOGLE_CLOUD_PROJECT") or log.get("project")
        trace_id = f"{span_context.trace_id:032x}"
        log[TRACE_FIELD] = f"projects/{project}/traces/{trace_id}" if project else trace_id
        log[SPAN_ID_FIELD] = f"{span_context.span_id:016x}"
        log[SAMPLED_FIELD] = span_context.trace_flags.sampled
    labels = {"handler": str(log.get("handler", ""))}
    if log.get("run_id"):
        labels["run_id"] = str(log["run_id"])
    log[LABELS_FIELD] = labels


def step(name: str) -> AbstractContextManager[Any]:
    """A child span of the current delivery span, if that one records."""
    if not _RECORDING.get():
        return _NO_STEP
    return _tracer.start_as_current_span(name)


def claim_step() -> AbstractContextManager[Any]:
    """The ``claim`` step: a child span if tracing records, and its duration if metered."""
    if not _RECORDING.get() and not _metering():
        return _NO_STEP
    return _ClaimStep()


class _ClaimStep:
    __slots__ = ("_started", "_step")

    def __enter__(self) -> None:
        self._step = step("claim")
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
    # Renewals are rare (once per 1/RENEWALS_PER_LEASE of a lease): no fast path needed.
    _instruments.renewals.add(1, {"handler": handler, "result": "renewed" if renewed else "failed"})


def lease_lost(handler: str) -> None:
    _instruments.leases_lost.add(1, {"handler": handler})
