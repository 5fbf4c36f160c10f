"""The emulator's metrics, named after Cloud Tasks' own, through the OpenTelemetry metrics API.

- ``cloudtasks.queue.depth``: tasks in each queue, due or not (Cloud Tasks' ``queue/depth``);
- ``cloudtasks.queue.task_attempt_count``: attempts by queue and response code (``none`` when
  no answer came back), like ``queue/task_attempt_count``;
- ``cloudtasks.queue.task_attempt_delays``: milliseconds from a task's schedule time to its
  attempt (``queue/task_attempt_delays``);
- ``cloudtasks.api.request_count``: API calls by method and response code
  (``api/request_count``).

Scheduler jobs count under the queue name ``scheduler/<job>``. Listeners added with
:func:`add_listener` see every attempt too (``tasklease dev`` prints a summary from them).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable

import flask
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from tasklease.emulator.db import EmulatorDB
from tasklease.emulator.sender import AttemptResult
from tasklease.plumbing import otel_setup

INSTRUMENTATION = "tasklease.emulator"
# Milliseconds, as Cloud Tasks reports attempt delays.
DELAY_BUCKETS = (0, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 60000, 600000)

Listener = Callable[[str, AttemptResult], None]

_databases: weakref.WeakSet[EmulatorDB] = weakref.WeakSet()
_listeners: list[Listener] = []
_lock = threading.Lock()


def _observe_depth(options: CallbackOptions) -> Iterable[Observation]:
    for db in list(_databases):
        for config in db.all_queues():
            name = config["name"]
            yield Observation(db.count_tasks(name), {"queue_id": _queue_id(name)})


class _Instruments:
    def __init__(self, meter: metrics.Meter) -> None:
        self.attempts = meter.create_counter(
            "cloudtasks.queue.task_attempt_count",
            unit="{attempt}",
            description="Task attempts by queue and response code.",
        )
        self.delays = meter.create_histogram(
            "cloudtasks.queue.task_attempt_delays",
            unit="ms",
            description="Delay between a task's schedule time and its attempt.",
            explicit_bucket_boundaries_advisory=DELAY_BUCKETS,
        )
        self.requests = meter.create_counter(
            "cloudtasks.api.request_count",
            unit="{request}",
            description="Emulator API calls by method and response code.",
        )
        meter.create_observable_gauge(
            "cloudtasks.queue.depth",
            callbacks=[_observe_depth],
            unit="{task}",
            description="Tasks in the queue, due or not.",
        )


_instruments = _Instruments(metrics.get_meter(INSTRUMENTATION))


def use_provider(meter_provider: metrics.MeterProvider | None = None) -> None:
    """Report to ``meter_provider`` (None: the global one, the default); for tests."""
    global _instruments  # noqa: PLW0603 - one meter per process.
    _instruments = _Instruments(metrics.get_meter(INSTRUMENTATION, meter_provider=meter_provider))


def watch(db: EmulatorDB) -> None:
    """Report the depth of ``db``'s queues, until :func:`unwatch`."""
    _databases.add(db)


def unwatch(db: EmulatorDB) -> None:
    _databases.discard(db)


def install(app: flask.Flask) -> None:
    """Count ``app``'s API calls; serve ``/metrics`` if ``TASKLEASE_METRICS=prometheus``."""
    setup = otel_setup.configure_from_env("tasklease-emulator")
    if setup.registry is not None:
        view = otel_setup.metrics_view(setup.registry)
        app.add_url_rule("/metrics", "metrics", view, methods=["GET"])

    @app.after_request
    def count(response: flask.Response) -> flask.Response:
        _instruments.requests.add(
            1, {"method": flask.request.method, "response_code": str(response.status_code)}
        )
        return response


def attempted(queue: str, scheduled_us: int, result: AttemptResult) -> None:
    """Record one attempt (``queue`` a queue path, or ``scheduler/<job>``)."""
    queue_id = _queue_id(queue)
    code = "none" if result.status is None else str(result.status)
    _instruments.attempts.add(1, {"queue_id": queue_id, "response_code": code})
    delay_ms = max(0.0, (result.started_us - scheduled_us) / 1000)
    _instruments.delays.record(delay_ms, {"queue_id": queue_id})
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(queue_id, result)


def add_listener(listener: Listener) -> None:
    with _lock:
        _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    with _lock:
        _listeners.remove(listener)


def _queue_id(queue: str) -> str:
    return queue if queue.startswith("scheduler/") else queue.rsplit("/", 1)[-1]
