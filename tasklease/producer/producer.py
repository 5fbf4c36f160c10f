"""Enqueue named, de-duplicated tasks for the worker, one at a time or many at once."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Unpack

from tasklease.producer import tracing
from tasklease.producer.attempts import Tries, failed_result
from tasklease.producer.batching import BatchSender
from tasklease.producer.building import (
    MAX_DISPATCH_DEADLINE,
    MAX_SCHEDULE_AHEAD,
    MIN_DISPATCH_DEADLINE,
    EnqueueOptions,
    Options,
    RunContext,
    TaskBuilder,
    TaskRoutes,
    env_settings,
    fan_out_done,
    fan_out_items,
    parented,
)
from tasklease.producer.cloud_tasks import CloudTasksTransport
from tasklease.producer.errors import EnqueueError
from tasklease.producer.results import EnqueueResult
from tasklease.producer.transport import TaskRequest, TaskTransport

__all__ = [
    "MAX_DISPATCH_DEADLINE",
    "MAX_SCHEDULE_AHEAD",
    "MIN_DISPATCH_DEADLINE",
    "Producer",
    "RunContext",
    "TaskRoutes",
]


class Producer(TaskBuilder[TaskTransport, Callable[[float], None]]):
    """Creates tasks that target ``POST {worker_url}/tasks/{task_name}`` with a JSON body.

    One producer per process is enough: it is thread-safe and creates its client lazily.
    ``enqueue_many`` and ``fan_out`` send up to 100 tasks of a queue per BatchCreateTasks
    call; ``batch=False`` creates each task with its own CreateTask instead.

    With ``router=`` (the worker's :class:`~tasklease.worker.Router`), a task name no task
    handler of that router has is refused with :class:`InvalidTask` before any network call:
    a misspelt name fails here rather than as a 404 on every delivery. Without it, names are
    not checked (a task for another service's worker).
    """

    def _default_transport(self, tasks_endpoint: str | None) -> TaskTransport:
        return CloudTasksTransport(endpoint=tasks_endpoint)

    def _default_sleep(self) -> Callable[[float], None]:
        return time.sleep

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Producer:
        """Configured from ``TASKLEASE_PROJECT`` (or ``GOOGLE_CLOUD_PROJECT``),
        ``TASKLEASE_LOCATION``, ``TASKLEASE_QUEUE``, ``TASKLEASE_WORKER_URL``,
        ``TASKLEASE_SERVICE_ACCOUNT``, ``TASKLEASE_AUDIENCE``, ``TASKLEASE_DISPATCH_DEADLINE``
        (seconds, the default for every task), ``TASKLEASE_TASKS_ENDPOINT`` (a local
        emulator) and ``TASKLEASE_BATCH`` (``0`` for single creates)."""
        settings = env_settings(environ, overrides)
        return cls(**settings)

    def enqueue(
        self,
        task_name: str,
        payload: Any = None,
        key: str | None = None,
        *,
        transaction: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> EnqueueResult:
        """Create one task; raise :class:`EnqueueError` if it could not be created.

        With ``key``, the task ID is derived from ``(task_name, key)``: enqueueing the same key
        again (within Cloud Tasks' de-duplication window, up to 24 hours) creates nothing and
        returns ``created=False``.

        With ``transaction=tx`` (see :mod:`tasklease.outbox`), nothing is sent: the task is
        written as an outbox entry through ``tx``, so it exists exactly when ``tx`` commits,
        and the outbox relay creates it under the same name.
        """
        with tracing.enqueue_span(task_name, self.queue_path(options.get("queue"))) as span:
            request = self._build(task_name, payload, key, Options(**options))
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
        transaction: Any = None,
        **options: Unpack[EnqueueOptions],
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
        with tracing.enqueue_span(task_name, self.queue_path(options.get("queue"))) as span:
            requests = self._build_many(task_name, items, Options(**options))
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
            return failed_result(request, key, attempts, exc)

    def fan_out(
        self,
        ctx: RunContext,
        task_name: str,
        items: Iterable[tuple[str, Any]],
        *,
        then: str | None = None,
        **options: Any,
    ) -> list[EnqueueResult]:
        """From a handler: one task per ``(item_key, payload)``, keyed by the run.

        Each child's key combines ``ctx.run_id`` with the item key, so a re-delivered (or
        retried) run re-creates nothing, while the next run creates fresh tasks. Every child
        is tried; if any could not be created, raises :class:`FanOutIncomplete` naming their
        keys, so the run is released rather than completed with children missing, and its
        retry creates only those (the others come back ``created=False``).

        ``then="handler"`` makes the fan-out a join: when every child has finished (completed,
        or failed for good), the task handler ``then`` runs once, with every child's key,
        status and result (see the fan-in guide). Item keys must then be unique, and the
        items the same in every attempt of the run (compute them in a step).
        """
        items = list(items)
        if then is None:
            results = self.enqueue_many(
                task_name, fan_out_items(ctx, items), **parented(ctx, options)
            )
            return fan_out_done(task_name, items, results)
        with tracing.enqueue_span(task_name, self.queue_path(options.get("queue"))) as span:
            requests, closing = self._build_fan_in(ctx, task_name, items, then, Options(**options))
            if closing is not None:
                return [self._create(closing[1], closing[0])]
            results = self.send(requests)
            tracing.enqueued(span, results)
        return fan_out_done(task_name, items, results)

    def close(self) -> None:
        self.transport.close()

    def _create(self, request: TaskRequest, key: str | None, attempts: int = 0) -> EnqueueResult:
        """One create with retries; an ALREADY_EXISTS after our own retry means created.

        ``attempts``: tries already made for this task (in a batch that left it uncertain).
        """
        tries = Tries(self.retry, attempts)
        while not isinstance(
            step := tries.create(request, key, self._answer(request)), EnqueueResult
        ):
            self._sleep(step)
        return step

    def _answer(self, request: TaskRequest) -> EnqueueError | None:
        try:
            self.transport.create_task(request, self.timeout)
        except EnqueueError as exc:
            return exc
        return None


def _stage(
    tx: Any, task_name: str, requests: Sequence[tuple[str | None, TaskRequest]]
) -> list[EnqueueResult]:
    from tasklease.outbox import staging  # noqa: PLC0415 - only callers of transaction= need it.

    return staging.stage(tx, task_name, requests)
