"""The outbox's metrics, through the OpenTelemetry API (no SDK: no-ops).

- ``tasklease.outbox.depth``: pending entries, as the relay last counted them;
- ``tasklease.outbox.oldest_age``: seconds since the oldest pending entry was staged;
- ``tasklease.outbox.relay_latency``: the entry's staging (inside the caller's transaction,
  just before its commit) to its task created, per entry.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

INSTRUMENTATION = "tasklease.outbox"

_lock = threading.Lock()
_last: tuple[int, float] | None = None


def _depth(options: CallbackOptions) -> Iterable[Observation]:
    with _lock:
        return [] if _last is None else [Observation(_last[0])]


def _oldest(options: CallbackOptions) -> Iterable[Observation]:
    with _lock:
        return [] if _last is None else [Observation(_last[1])]


class _Instruments:
    def __init__(self, meter: metrics.Meter) -> None:
        self.latency = meter.create_histogram(
            "tasklease.outbox.relay_latency",
            unit="s",
            description="From the enqueuing transaction's commit to the task created.",
        )
        meter.create_observable_gauge(
            "tasklease.outbox.depth",
            [_depth],
            unit="{entry}",
            description="Outbox entries waiting for the relay.",
        )
        meter.create_observable_gauge(
            "tasklease.outbox.oldest_age",
            [_oldest],
            unit="s",
            description="Age of the oldest outbox entry waiting for the relay.",
        )


_instruments = _Instruments(metrics.get_meter(INSTRUMENTATION))


def use_provider(meter_provider: metrics.MeterProvider | None = None) -> None:
    """Send the outbox's metrics to this provider (None: the global one)."""
    global _instruments  # noqa: PLW0603 - one meter per process.
    _instruments = _Instruments(metrics.get_meter(INSTRUMENTATION, meter_provider=meter_provider))


def relayed(task_name: str, latency: float) -> None:
    _instruments.latency.record(max(0.0, latency), {"task_name": task_name})


def observe(depth: int, oldest_age: float) -> None:
    global _last  # noqa: PLW0603 - the gauges' last reading.
    with _lock:
        _last = (depth, oldest_age)
