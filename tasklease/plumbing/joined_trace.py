"""The trace that the delivery being served joined, for the tasks its handler enqueues.

The worker sets it for each delivery; the producer reads it when no OpenTelemetry span is
current (OpenTelemetry was not loaded yet when the delivery started), so a fan-out carries
the caller's trace all the same. It lives here, owned by neither role, so that the producer
imports nothing of the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext

# Reads the joined trace's span context, or None before the delivery joined its caller's
# trace (an unauthenticated request's traceparent is anyone's to choose). A reader, not the
# value: parsing the headers needs OpenTelemetry, loaded only once a producer asks.
JoinedTrace = Callable[[], "SpanContext | None"]
JOINED_TRACE: ContextVar[JoinedTrace | None] = ContextVar("tasklease_joined_trace", default=None)


def joined_context() -> SpanContext | None:
    """The span context of the caller's trace that the current delivery joined, if any."""
    read = JOINED_TRACE.get()
    return None if read is None else read()
