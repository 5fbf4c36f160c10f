"""Enqueue named, de-duplicated tasks for the worker, one at a time or many at once."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from tasklease.producer import tracing
from tasklease.producer.batching import BatchSender
from tasklease.producer.cloud_tasks import CloudTasksTransport
from tasklease.producer.errors import (
    EnqueueError,
    InvalidTask,
    TaskAlreadyExists,
    TransientEnqueueError,
)
from tasklease.producer.naming import random_task_id, task_id
from tasklease.producer.results import EnqueueResult, FanOutIncomplete
from tasklease.producer.retry import RetryPolicy
from tasklease.producer.transport import TaskRequest, TaskTransport
from tasklease.protocol import (
    LARGE_TASK_BYTES,
    LOCATION_HEADER,
    MAX_TASK_BYTES,
    PROJECT_HEADER,
    TASK_ROUTE_PREFIX,
)

_log = logging.getLogger("tasklease.producer")

# Platform limits (docs/platform-facts.md); the task size limits are the protocol's.
MAX_SCHEDULE_AHEAD = timedelta(days=30)
MIN_DISPATCH_DEADLINE = timedelta(seconds=15)
MAX_DISPATCH_DEADLINE = timedelta(minutes=30)
# Headers the producer sets itself; a caller may not override them.
_RESERVED_HEADER_PREFIXES = ("x-cloudtasks-", "x-appengine-", "x-cloudscheduler", "authorization")


class RunContext(Protocol):
    """What :meth:`Producer.fan_out` needs of the scheduled run: a
    ``tasklease.worker.TaskContext`` fits."""

    @property
    def run_id(self) -> str: ...


class TaskRoutes(Protocol):
    """What a producer given ``router=`` needs of it: a ``tasklease.worker.Router`` fits."""

    def has_task(self, name: str) -> bool: ...


@dataclass(frozen=True)
class _Options:
    """The per-call options of enqueue and enqueue_many."""

    delay: timedelta | None = None
    at: datetime | None = None
    queue: str | None = None
    dispatch_deadline: timedelta | None = None
    headers: Mapping[str, str] | None = None


class Producer:
    """Creates tasks that target ``POST {worker_url}/tasks/{task_name}`` with a JSON body.

    One producer per process is enough: it is thread-safe and creates its client lazily.
    ``enqueue_many`` and ``fan_out`` send up to 100 tasks of a queue per BatchCreateTasks
    call; ``batch=False`` creates each task with its own CreateTask instead.

    With ``router=`` (the worker's :class:`~tasklease.worker.Router`), a task name no task
    handler of that router has is refused with :class:`InvalidTask` before any network call:
    a misspelt name fails here rather than as a 404 on every delivery. Without it, names are
    not checked (a task for another service's worker).
    """

    def __init__(
        self,
        project: str,
        location: str,
        queue: str = "default",
        worker_url: str = "",
        service_account: str | None = None,
        *,
        audience: str | None = None,
        transport: TaskTransport | None = None,
        tasks_endpoint: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 10.0,
        dispatch_deadline: timedelta | None = None,
        sleep: Callable[[float], None] = time.sleep,
        batch: bool = True,
        router: TaskRoutes | None = None,
    ) -> None:
        if not project or not location or not queue:
            raise ValueError("project, location and queue are required")
        if not worker_url.startswith(("http://", "https://")):
            raise ValueError(f"worker_url must be an http(s) URL, not {worker_url!r}")
        self.project = project
        self.location = location
        self.queue = queue
        self.worker_url = worker_url.rstrip("/")
        self.service_account = service_account
        self.audience = audience or (self.worker_url if service_account else None)
        self.transport = transport or CloudTasksTransport(endpoint=tasks_endpoint)
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self.dispatch_deadline = _dispatch_deadline(dispatch_deadline)
        self._sleep = sleep
        self.batch = batch
        self.router = router

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Producer:
        """Configured from ``TASKLEASE_PROJECT`` (or ``GOOGLE_CLOUD_PROJECT``),
        ``TASKLEASE_LOCATION``, ``TASKLEASE_QUEUE``, ``TASKLEASE_WORKER_URL``,
        ``TASKLEASE_SERVICE_ACCOUNT``, ``TASKLEASE_AUDIENCE``, ``TASKLEASE_DISPATCH_DEADLINE``
        (seconds, the default for every task), ``TASKLEASE_TASKS_ENDPOINT`` (a local
        emulator) and ``TASKLEASE_BATCH`` (``0`` for single creates)."""
        env = os.environ if environ is None else environ
        missing = [
            name
            for name, value in [
                (
                    "TASKLEASE_PROJECT",
                    env.get("TASKLEASE_PROJECT") or env.get("GOOGLE_CLOUD_PROJECT"),
                ),
                ("TASKLEASE_LOCATION", env.get("TASKLEASE_LOCATION")),
                ("TASKLEASE_WORKER_URL", env.get("TASKLEASE_WORKER_URL")),
            ]
            if not value and name.split("_", 1)[1].lower() not in overrides
        ]
        if missing:
            raise ValueError(f"set {', '.join(missing)} to configure the producer")
        settings: dict[str, Any] = {
            "project": env.get("TASKLEASE_PROJECT") or env.get("GOOGLE_CLOUD_PROJECT"),
            "location": env.get("TASKLEASE_LOCATION"),
            "queue": env.get("TASKLEASE_QUEUE") or "default",
            "worker_url": env.get("TASKLEASE_WORKER_URL"),
            "service_account": env.get("TASKLEASE_SERVICE_ACCOUNT") or None,
            "audience": env.get("TASKLEASE_AUDIENCE") or None,
            "tasks_endpoint": env.get("TASKLEASE_TASKS_ENDPOINT") or None,
        }
        deadline = env.get("TASKLEASE_DISPATCH_DEADLINE")
        if deadline:
            settings["dispatch_deadline"] = timedelta(seconds=float(deadline))
        if env.get("TASKLEASE_BATCH", "").strip().lower() in ("0", "false", "no", "off"):
            settings["batch"] = False
        settings.update(overrides)
        return cls(**settings)

    def queue_path(self, queue: str | None = None) -> str:
        return f"projects/{self.project}/locations/{self.location}/queues/{queue or self.queue}"

    def enqueue(
        self,
        task_name: str,
        payload: Any = None,
        key: str | None = None,
        *,
        delay: timedelta | None = None,
        at: datetime | None = None,
        queue: str | None = None,
        dispatch_deadline: timedelta | None = None,
        headers: Mapping[str, str] | None = None,
        transaction: Any = None,
    ) -> EnqueueResult:
        """Create one task; raise :class:`EnqueueError` if it could not be created.

        With ``key``, the task ID is derived from ``(task_name, key)``: enqueueing the same key
        again (within Cloud Tasks' de-duplication window, up to 24 hours) creates nothing and
        returns ``created=False``.

        With ``transaction=tx`` (see :mod:`tasklease.outbox`), nothing is sent: the task is
        written as an outbox entry through ``tx``, so it exists exactly when ``tx`` commits,
        and the outbox relay creates it under the same name.
        """
        options = _Options(delay, at, queue, dispatch_deadline, headers)
        with tracing.enqueue_span(task_name, self.queue_path(queue)) as span:
            request = self._build(task_name, payload, key, options)
            if transaction is not None:
                return _stage(transaction, task_name, [(key, request)])[0]
            result = self._create(request, key)
            tracing.enqueued(span, [result])
        return result

    def enqueue_many(
        self,
        task_name: str,
        items: Iterable[tuple[str, Any]],
        *,
        concurrency: int = 32,
        delay: timedelta | None = None,
        at: datetime | None = None,
        queue: str | None = None,
        dispatch_deadline: timedelta | None = None,
        headers: Mapping[str, str] | None = None,
        transaction: Any = None,
    ) -> list[EnqueueResult]:
        """Create one task per ``(key, payload)`` item, ``concurrency`` calls at a time.

        Items are sent in batches of up to 100 of a queue (single creates with
        ``Producer(batch=False)`` or a transport without batches). Returns one result per
        item, in order; a failed item has ``error`` set and never stops the others. Every
        item is validated before anything is sent. With ``transaction=tx``, every item is
        staged through ``tx`` instead, as :meth:`enqueue` does.
        """
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        options = _Options(delay, at, queue, dispatch_deadline, headers)
        with tracing.enqueue_span(task_name, self.queue_path(queue)) as span:
            requests: list[tuple[str | None, TaskRequest]] = [
                (key, self._build(task_name, payload, key, options)) for key, payload in items
            ]
            if transaction is not None:
                return _stage(transaction, task_name, requests) if requests else []
            results = self.send(requests, concurrency)
            tracing.enqueued(span, results)
        return results

    def send(
        self, requests: Sequence[tuple[str | None, TaskRequest]], concurrency: int = 32
    ) -> list[EnqueueResult]:
        """Create already built ``(key, request)`` tasks (the outbox relay's path): batched,
        ALREADY_EXISTS taken as done, one result per request, in order."""
        if not requests:
            return []
        if self.batch and self.transport.max_batch_size > 0:
            sender = BatchSender(self.transport, self.retry, self.timeout, self._sleep)
            return sender.create_many(requests, concurrency, self._create_settled)

        def create(item: tuple[str | None, TaskRequest]) -> EnqueueResult:
            return self._create_settled(item[1], item[0], 0)

        with ThreadPoolExecutor(min(concurrency, len(requests)), "tasklease-enqueue") as pool:
            return list(pool.map(create, requests))

    def _create_settled(
        self, request: TaskRequest, key: str | None, attempts: int
    ) -> EnqueueResult:
        """:meth:`_create`, its error in the result rather than raised."""
        try:
            return self._create(request, key, attempts)
        except EnqueueError as exc:
            return EnqueueResult(request.name, request.task_id, key, False, attempts, exc)

    def fan_out(
        self,
        ctx: RunContext,
        task_name: str,
        items: Iterable[tuple[str, Any]],
        **options: Any,
    ) -> list[EnqueueResult]:
        """From a scheduled handler: one task per ``(item_key, payload)``, keyed by the run.

        Each child's key combines ``ctx.run_id`` with the item key, so a re-delivered (or
        retried) scheduler run re-creates nothing, while the next run creates fresh tasks.
        Every child is tried; if any could not be created, raises :class:`FanOutIncomplete`
        naming their keys, so the run is released rather than completed with children missing,
        and its retry creates only those (the others come back ``created=False``).
        """
        items = list(items)
        keyed = [(f"{ctx.run_id}/{item_key}", payload) for item_key, payload in items]
        results = self.enqueue_many(task_name, keyed, **options)
        tracing.fan_out_children(task_name, results)
        failed = [
            str(key) for (key, _), result in zip(items, results, strict=True) if not result.ok
        ]
        if failed:
            raise FanOutIncomplete(results, failed)
        return results

    def close(self) -> None:
        self.transport.close()

    def _build(
        self, task_name: str, payload: Any, key: str | None, options: _Options
    ) -> TaskRequest:
        """Validate everything and build the request, before any network call."""
        if not task_name or not all(
            ch.isascii() and (ch.isalnum() or ch in "-_") for ch in task_name
        ):
            raise InvalidTask(f"task_name {task_name!r}: use letters, digits, '-' or '_'")
        if self.router is not None and not self.router.has_task(task_name):
            raise InvalidTask(
                f"task_name {task_name!r}: the producer's router has no task handler of that "
                "name (a typo? enqueue by reference, handler.enqueue(...), cannot misspell it)"
            )
        if key is not None and (not isinstance(key, str) or not key):
            raise InvalidTask("key must be a non-empty string (or None for a random name)")
        try:
            body = json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidTask(f"payload is not JSON-serialisable: {exc}") from exc
        task_headers = {
            "Content-Type": "application/json",
            PROJECT_HEADER: self.project,
            LOCATION_HEADER: self.location,
            **tracing.trace_headers(),  # The caller's own headers below may replace them.
        }
        for name, value in (options.headers or {}).items():
            if name.lower().startswith(_RESERVED_HEADER_PREFIXES):
                raise InvalidTask(f"header {name} is set by Cloud Tasks or the producer")
            task_headers[name] = value
        request = TaskRequest(
            queue_path=self.queue_path(options.queue),
            task_id=task_id(task_name, key) if key is not None else random_task_id(task_name),
            url=f"{self.worker_url}{TASK_ROUTE_PREFIX}{task_name}",
            body=body,
            headers=task_headers,
            service_account=self.service_account,
            audience=self.audience,
            schedule_time=_schedule_time(options.delay, options.at),
            dispatch_deadline=_dispatch_deadline(options.dispatch_deadline)
            or self.dispatch_deadline,
        )
        size = _task_size(request)
        if size > MAX_TASK_BYTES:
            raise InvalidTask(
                f"task is {size} bytes, over Cloud Tasks' {MAX_TASK_BYTES}: store the payload "
                "elsewhere (GCS, Firestore) and enqueue a reference to it"
            )
        if size > LARGE_TASK_BYTES:
            _log.warning(
                "task %s is %d bytes: Cloud Tasks takes up to 1 MB (its quotas page), though its "
                "API reference still says %d; large payloads are better stored elsewhere",
                request.task_id,
                size,
                LARGE_TASK_BYTES,
            )
        return request

    def _create(self, request: TaskRequest, key: str | None, attempts: int = 0) -> EnqueueResult:
        """One create with retries; an ALREADY_EXISTS after our own retry means created.

        ``attempts``: tries already made for this task (in a batch that left it uncertain).
        """
        delays = self.retry.delays()
        while True:
            attempts += 1
            try:
                self.transport.create_task(request, self.timeout)
            except TaskAlreadyExists:
                # After a transient failure, the earlier attempt may have created it.
                return EnqueueResult(request.name, request.task_id, key, attempts > 1, attempts)
            except TransientEnqueueError as exc:
                pause = next(delays, None)
                if pause is None:
                    raise TransientEnqueueError(
                        f"gave up creating {request.name} after {attempts} attempts: {exc}"
                    ) from exc
                self._sleep(pause)
                continue
            return EnqueueResult(request.name, request.task_id, key, True, attempts)


def _stage(
    tx: Any, task_name: str, requests: Sequence[tuple[str | None, TaskRequest]]
) -> list[EnqueueResult]:
    from tasklease.outbox import staging  # noqa: PLC0415 - only callers of transaction= need it.

    return staging.stage(tx, task_name, requests)


def _schedule_time(delay: timedelta | None, at: datetime | None) -> datetime | None:
    if delay is not None and at is not None:
        raise InvalidTask("give delay or at, not both")
    now = datetime.now(UTC)
    if delay is not None:
        if delay < timedelta(0):
            raise InvalidTask("delay must not be negative")
        at = now + delay
    if at is None:
        return None
    if at.tzinfo is None:
        raise InvalidTask("at must be timezone-aware (e.g. datetime.now(timezone.utc))")
    if at - now > MAX_SCHEDULE_AHEAD:
        raise InvalidTask(f"schedule time is more than {MAX_SCHEDULE_AHEAD.days} days ahead")
    return at.astimezone(UTC)


def _dispatch_deadline(deadline: timedelta | None) -> timedelta | None:
    if deadline is not None and not MIN_DISPATCH_DEADLINE <= deadline <= MAX_DISPATCH_DEADLINE:
        raise InvalidTask("dispatch_deadline must be between 15 seconds and 30 minutes")
    return deadline


def _task_size(request: TaskRequest) -> int:
    headers = sum(len(name) + len(value) for name, value in request.headers.items())
    return len(request.body) + headers + len(request.url) + len(request.name)
