"""Traces, metrics and log correlation of each delivery, through the OpenTelemetry API.

With an SDK (see :mod:`tasklease.plumbing.otel_setup`, or the application's own) each delivery
gets a span named ``task <handler>`` or ``job <handler>`` with child spans ``claim``,
``handler`` and ``finish``, and these metrics:

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

This module is the face, and imports no OpenTelemetry: until some module of the process
imports ``opentelemetry`` (an SDK, ``opentelemetry-instrument``, tasklease's producer) or
``OTEL_PYTHON_TRACER_PROVIDER`` / ``OTEL_PYTHON_METER_PROVIDER`` names a provider, no
provider can be set and every span and metric would be a no-op. Then a delivery only reads
the caller's trace (:class:`TraceParent`) for its log line's trace fields. Each delivery looks
again (one dict look-up), so providers an application sets after :func:`create_app` serve
the next delivery; from then on :mod:`tasklease.worker.observe.otel_telemetry` serves deliveries.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any

from tasklease.plumbing import joined_trace

if TYPE_CHECKING:
    from opentelemetry import metrics, trace

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

# W3C traceparent as OpenTelemetry's propagator reads it (the same pattern and checks as
# opentelemetry/trace/propagation/tracecontext.py): version-trace-span-flags; a version
# after 00 may append fields, 00 may not; ff is no version.
_TRACEPARENT = re.compile(
    "^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:(-.*)|[ \t]*)$"
)
TRACEPARENT_MAX_CHARS = 512
# Cloud Run's header: a 32-hex trace id, a decimal span id, ``o=1`` when sampled.
_CLOUD_TRACE = re.compile(r"([0-9a-fA-F]{32})/([0-9]{1,20})(?:;o=([0-9]+))?")
_NO_STEP: AbstractContextManager[Any] = nullcontext()
_ENV_PROVIDERS = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ or (
    "OTEL_PYTHON_METER_PROVIDER" in os.environ
)

HeaderLookup = Callable[[str], Sequence[str]]


class TraceParent:
    """A caller's trace id, span id and sampled flag: what Cloud Logging's trace fields name."""

    __slots__ = ("sampled", "span_id", "trace_id")

    def __init__(self, trace_id: int, span_id: int, sampled: bool) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.sampled = sampled

    def __repr__(self) -> str:
        return f"TraceParent({self.trace_id:032x}, {self.span_id:016x}, sampled={self.sampled})"


def parse_traceparent(value: str) -> TraceParent | None:
    """A W3C ``traceparent`` value; None if malformed, all zeros or of version ff."""
    if len(value) > TRACEPARENT_MAX_CHARS:
        return None
    match = _TRACEPARENT.match(value)
    if match is None or match[1] == "ff" or (match[1] == "00" and match[5]):
        return None
    trace_id, span_id = int(match[2], 16), int(match[3], 16)
    if not trace_id or not span_id:
        return None
    return TraceParent(trace_id, span_id, sampled=bool(int(match[4], 16) & 1))


def parse_cloud_trace(value: str) -> TraceParent | None:
    """``TRACE_ID/SPAN_ID;o=1``; None if malformed or all zeros."""
    match = _CLOUD_TRACE.fullmatch(value.strip())
    if match is None:
        return None
    trace_id, span_id = int(match[1], 16), int(match[2])
    if not trace_id or not 0 < span_id < 2**64:
        return None
    return TraceParent(trace_id, span_id, sampled=match[3] is not None and bool(int(match[3]) & 1))


def incoming_trace(header: HeaderLookup) -> TraceParent | None:
    """The caller's trace: W3C ``traceparent``, else ``X-Cloud-Trace-Context``."""
    traceparent = header("traceparent")
    found = parse_traceparent(traceparent[0]) if traceparent else None
    if found is None:
        cloud = header(CLOUD_TRACE_HEADER)
        found = parse_cloud_trace(cloud[0]) if cloud else None
    return found


class DeliveryTrace:
    """One delivery's trace, current while the delivery is served; this class serves it
    without OpenTelemetry (:mod:`tasklease.worker.observe.otel_telemetry` subclasses it).

    ``label`` names the handler in metrics and the span name: only registered names, so a
    caller cannot grow the metrics' label sets by inventing paths. The delivery joins the
    caller's trace only once the request is authenticated (:func:`authenticated`): until
    then ``traceparent`` is anyone's to choose, and a refused request's log line does not
    land in a trace a stranger named.
    """

    __slots__ = ("_caller", "_delivery", "_ended", "_joined", "header", "kind", "label")

    def __init__(self, header: HeaderLookup, kind: str, label: str) -> None:
        self.header = header
        self.kind = kind
        self.label = label
        self._caller: TraceParent | None = None
        self._ended = False
        self._delivery = _DELIVERY.set(self)
        self._joined = joined_trace.JOINED_TRACE.set(self.joined_context)

    def trusted(self) -> None:
        """The request is authenticated: the delivery joins the caller's trace."""
        self._caller = incoming_trace(self.header)

    def caller(self) -> TraceParent | None:
        """The caller's trace once joined, when OpenTelemetry did not make it current."""
        return self._caller

    def joined_context(self) -> trace.SpanContext | None:
        """The caller's span context once this delivery joined its trace, if OpenTelemetry
        was not loaded when it started (the producer, imported by its handler, say): so a
        fan-out from it carries the trace all the same."""
        if self.caller() is None:
            return None
        from tasklease.worker.observe import otel_telemetry  # noqa: PLC0415 - the caller holds OpenTelemetry.

        return otel_telemetry.incoming_context(self.header)

    def step(self, name: str) -> AbstractContextManager[Any]:
        return _NO_STEP

    def claim_step(self) -> AbstractContextManager[Any]:
        return _NO_STEP

    def __enter__(self) -> DeliveryTrace:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end()

    def finished(self, status: int, outcome: Outcome, log: dict[str, Any], seconds: float) -> None:
        """Add the trace fields to the delivery's log line."""
        log_fields(self._caller, log)
        self._end()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            joined_trace.JOINED_TRACE.reset(self._joined)
            _DELIVERY.reset(self._delivery)


# The delivery being served, for :func:`authenticated` and the steps.
_DELIVERY: ContextVar[DeliveryTrace | None] = ContextVar("tasklease_delivery", default=None)
_serving: list[type[DeliveryTrace]] = [DeliveryTrace]  # The OpenTelemetry subclass once used.


def opentelemetry_in_use() -> bool:
    """Whether anything in the process can use OpenTelemetry; if so, deliveries use it."""
    if _serving[0] is DeliveryTrace:
        if not _ENV_PROVIDERS and "opentelemetry" not in sys.modules:
            return False
        from tasklease.worker.observe import otel_telemetry  # noqa: PLC0415 - only when it can be used.

        _serving[0] = otel_telemetry.OtelDeliveryTrace
    return True


def start_delivery(header: HeaderLookup, kind: str, label: str) -> DeliveryTrace:
    """The trace of a delivery that starts now: a context manager, ended by ``finished``."""
    opentelemetry_in_use()
    return _serving[0](header, kind, label)


def authenticated() -> None:
    """The current delivery's request is authenticated: it joins the caller's trace."""
    delivery = _DELIVERY.get()
    if delivery is not None:
        delivery.trusted()


def step(name: str) -> AbstractContextManager[Any]:
    """A child span of the current delivery span, if that one records."""
    delivery = _DELIVERY.get()
    return _NO_STEP if delivery is None else delivery.step(name)


def claim_step() -> AbstractContextManager[Any]:
    """The ``claim`` step: a child span if tracing records, and its duration if metered."""
    delivery = _DELIVERY.get()
    return _NO_STEP if delivery is None else delivery.claim_step()


def log_fields(caller: TraceParent | None, log: dict[str, Any]) -> None:
    """Add Cloud Logging's trace fields (when a trace is known) and labels to ``log``.

    The trace is ``projects/PROJECT/traces/TRACE_ID``, PROJECT from ``GOOGLE_CLOUD_PROJECT``
    or else the delivery's project; with neither, the bare trace id.
    """
    if caller is not None:
        project = os.environ.get("GOOGLE_CLOUD_PROJECT") or log.get("project")
        trace_id = f"{caller.trace_id:032x}"
        log[TRACE_FIELD] = f"projects/{project}/traces/{trace_id}" if project else trace_id
        log[SPAN_ID_FIELD] = f"{caller.span_id:016x}"
        log[SAMPLED_FIELD] = caller.sampled
    labels = {"handler": str(log.get("handler", ""))}
    if log.get("run_id"):
        labels["run_id"] = str(log["run_id"])
    log[LABELS_FIELD] = labels


def use_providers(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> None:
    """Send the worker's spans and metrics to these providers (None: the global ones, the
    default). For tests, and applications that keep their providers out of the global API."""
    from tasklease.worker.observe import otel_telemetry  # noqa: PLC0415 - the caller holds OpenTelemetry.

    otel_telemetry.use_providers(tracer_provider, meter_provider)
    opentelemetry_in_use()


def lease_renewed(handler: str, renewed: bool) -> None:
    # Renewals are rare (once per 1/RENEWALS_PER_LEASE of a lease): no fast path needed.
    if opentelemetry_in_use():
        from tasklease.worker.observe import otel_telemetry  # noqa: PLC0415 - loaded by the check.

        otel_telemetry.lease_renewed(handler, renewed)


def lease_lost(handler: str) -> None:
    if opentelemetry_in_use():
        from tasklease.worker.observe import otel_telemetry  # noqa: PLC0415 - loaded by the check.

        otel_telemetry.lease_lost(handler)
