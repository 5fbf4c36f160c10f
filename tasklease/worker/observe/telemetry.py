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
What both halves share is below them, in :mod:`tasklease.worker.observe.delivery_trace`.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from tasklease.worker.observe.delivery_trace import (
    UNKNOWN_HANDLER,
    DeliveryTrace,
    HeaderLookup,
    TraceParent,
    authenticated,
    claim_step,
    log_fields,
    parse_cloud_trace,
    parse_traceparent,
    step,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from opentelemetry import metrics, trace

# The delivery's trace as its callers read it, from here; defined in delivery_trace.
__all__ = [
    "UNKNOWN_HANDLER",
    "DeliveryTrace",
    "TraceParent",
    "authenticated",
    "claim_step",
    "lease_lost",
    "lease_renewed",
    "log_fields",
    "opentelemetry_in_use",
    "parse_cloud_trace",
    "parse_traceparent",
    "start_delivery",
    "step",
    "use_providers",
]

_ENV_PROVIDERS = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ or (
    "OTEL_PYTHON_METER_PROVIDER" in os.environ
)


def _caller_span_context(header: HeaderLookup) -> trace.SpanContext | None:
    """For a delivery begun without OpenTelemetry: its caller's span context, once a producer
    that holds OpenTelemetry asks for it."""
    from tasklease.worker.observe import otel_telemetry  # noqa: PLC0415 - the caller holds OpenTelemetry.

    return otel_telemetry.incoming_context(header)


def _plain_delivery(header: HeaderLookup, kind: str, label: str) -> DeliveryTrace:
    return DeliveryTrace(header, kind, label, span_context=_caller_span_context)


# How a delivery's trace is made: without OpenTelemetry, until something can use it.
_serving: list[Callable[[HeaderLookup, str, str], DeliveryTrace]] = [_plain_delivery]


def opentelemetry_in_use() -> bool:
    """Whether anything in the process can use OpenTelemetry; if so, deliveries use it."""
    if _serving[0] is _plain_delivery:
        if not _ENV_PROVIDERS and "opentelemetry" not in sys.modules:
            return False
        from tasklease.worker.observe import otel_telemetry  # noqa: PLC0415 - only when it can be used.

        _serving[0] = otel_telemetry.OtelDeliveryTrace
    return True


def start_delivery(header: HeaderLookup, kind: str, label: str) -> DeliveryTrace:
    """The trace of a delivery that starts now: a context manager, ended by ``finished``."""
    opentelemetry_in_use()
    return _serving[0](header, kind, label)


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
