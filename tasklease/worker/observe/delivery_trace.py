"""One delivery's trace without OpenTelemetry: the caller's trace as its headers carry it,
the delivery being served, and Cloud Logging's trace fields on its log line.

The OpenTelemetry half (:mod:`tasklease.worker.observe.otel_telemetry`) builds on this one, and
:mod:`tasklease.worker.observe.telemetry` picks between them: this module sits below both, so
neither imports the other back.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any

from tasklease.plumbing import joined_trace

if TYPE_CHECKING:
    from opentelemetry import trace

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

HeaderLookup = Callable[[str], Sequence[str]]
# The caller's span context, read from the headers through OpenTelemetry.
SpanContextReader = Callable[[HeaderLookup], "trace.SpanContext | None"]


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
    ``span_context`` reads the caller's span context from the headers through OpenTelemetry,
    for a producer that loaded it later (:meth:`joined_context`).

    ``label`` names the handler in metrics and the span name: only registered names, so a
    caller cannot grow the metrics' label sets by inventing paths. The delivery joins the
    caller's trace only once the request is authenticated (:func:`authenticated`): until
    then ``traceparent`` is anyone's to choose, and a refused request's log line does not
    land in a trace a stranger named.
    """

    __slots__ = (
        "_caller",
        "_delivery",
        "_ended",
        "_joined",
        "_span_context",
        "header",
        "kind",
        "label",
    )

    def __init__(
        self, header: HeaderLookup, kind: str, label: str, *, span_context: SpanContextReader
    ) -> None:
        self.header = header
        self.kind = kind
        self.label = label
        self._span_context = span_context
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
        return self._span_context(self.header)

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
