"""Enqueue from async code (a FastAPI endpoint, an ``async def`` handler) without blocking
the event loop: :class:`AsyncProducer`, the coroutine twin of :class:`Producer`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, Unpack
from urllib.parse import urlsplit

from tasklease.producer import tracing
from tasklease.producer.async_transport import AsyncTaskTransport, CloudTasksAsyncTransport
from tasklease.producer.attempts import Sent, Tries, failed_result
from tasklease.producer.batching import BatchRound
from tasklease.producer.building import (
    EnqueueOptions,
    Options,
    RunContext,
    TaskBuilder,
    env_settings,
    fan_out_done,
    fan_out_items,
    parented,
)
from tasklease.producer.errors import EnqueueError
from tasklease.producer.results import EnqueueResult
from tasklease.producer.transport import BatchOutcome, TaskRequest

T = TypeVar("T")
GRPC_ENDPOINT_ENV = "TASKLEASE_TASKS_GRPC_ENDPOINT"


class AsyncProducer(TaskBuilder[AsyncTaskTransport, Callable[[float], Awaitable[None]]]):
    """:class:`~tasklease.producer.Producer` with coroutines, on ``CloudTasksAsyncClient``.

    The same task names (hash first, from the key), validation, errors, ``router=`` check,
    retries, batches of up to 100 and trace headers as :class:`Producer`; every call awaits
    the API instead of blocking a thread, so an ``async def`` endpoint enqueues while its loop
    keeps serving. ``async with AsyncProducer(...) as producer:`` closes the client (or call
    :meth:`aclose`). Make it, or at least first use it, in the loop it will serve: its gRPC
    channel belongs to that loop.

    ``tasks_endpoint`` is a local emulator's gRPC address (``127.0.0.1:8124``); the client
    library's async client speaks only gRPC.
    """

    def _default_transport(self, tasks_endpoint: str | None) -> AsyncTaskTransport:
        return CloudTasksAsyncTransport(endpoint=tasks_endpoint)

    def _default_sleep(self) -> Callable[[float], Awaitable[None]]:
        return asyncio.sleep

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> AsyncProducer:
        """The variables of :meth:`Producer.from_env`; a local emulator is reached at
        ``TASKLEASE_TASKS_GRPC_ENDPOINT`` (``host:port``), else, when only
        ``TASKLEASE_TASKS_ENDPOINT`` is set, at its port + 1 (the emulator's gRPC port when
        it was started on a fixed port)."""
        env = os.environ if environ is None else environ
        settings = env_settings(env, overrides)
        if "tasks_endpoint" not in overrides:
            settings["tasks_endpoint"] = grpc_endpoint(env)
        return cls(**settings)

    async def enqueue(
        self,
        task_name: str,
        payload: Any = None,
        key: str | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> EnqueueResult:
        """Create one task: :meth:`Producer.enqueue`, awaited."""
        with tracing.enqueue_span(task_name, self.queue_path(options.get("queue"))) as span:
            result = await self._create(
                self._build(task_name, payload, key, Options(**options)), key
            )
            tracing.enqueued(span, [result])
        return result

    async def enqueue_many(
        self,
        task_name: str,
        items: Iterable[tuple[str, Any]],
        *,
        concurrency: int = 32,
        **options: Unpack[EnqueueOptions],
    ) -> list[EnqueueResult]:
        """One task per ``(key, payload)``, ``concurrency`` calls in flight at a time:
        :meth:`Producer.enqueue_many`, awaited."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        with tracing.enqueue_span(task_name, self.queue_path(options.get("queue"))) as span:
            requests = self._build_many(task_name, items, Options(**options))
            results = await self._create_many(requests, asyncio.Semaphore(concurrency))
            tracing.enqueued(span, results)
        return results

    async def fan_out(
        self,
        ctx: RunContext,
        task_name: str,
        items: Iterable[tuple[str, Any]],
        *,
        then: str | None = None,
        **options: Any,
    ) -> list[EnqueueResult]:
        """From a handler, one task per item keyed by the run: :meth:`Producer.fan_out`
        (``then=`` too), awaited (raises the same :class:`FanOutIncomplete`)."""
        items = list(items)
        if then is None:
            results = await self.enqueue_many(
                task_name, fan_out_items(ctx, items), **parented(ctx, options)
            )
            return fan_out_done(task_name, items, results)
        requests, closing = self._build_fan_in(ctx, task_name, items, then, Options(**options))
        if closing is not None:
            return [await self._create(closing[1], closing[0])]
        results = await self._create_many(requests, asyncio.Semaphore(32))
        return fan_out_done(task_name, items, results)

    async def aclose(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _create_many(
        self, requests: Sequence[tuple[str | None, TaskRequest]], limit: asyncio.Semaphore
    ) -> list[EnqueueResult]:
        if not requests:
            return []
        if not (self.batch and self.transport.max_batch_size > 0):
            singles = [self._create_settled(request, key, 0) for key, request in requests]
            return await _gather(singles, limit)
        batches = BatchRound(requests, self.transport.max_batch_size)
        sent = await _gather([self._send(*batches.batch(b)) for b in batches.batches], limit)
        for batch, outcome in zip(batches.batches, sent, strict=True):
            batches.record(batch, outcome)
        later = [self._create_settled(*batches.single(entry)) for entry in batches.later]
        return batches.finished(await _gather(later, limit))

    async def _create_settled(
        self, request: TaskRequest, key: str | None, attempts: int
    ) -> EnqueueResult:
        """:meth:`_create`, its error in the result rather than raised."""
        try:
            return await self._create(request, key, attempts)
        except EnqueueError as exc:
            return failed_result(request, key, attempts, exc)

    async def _create(
        self, request: TaskRequest, key: str | None, attempts: int = 0
    ) -> EnqueueResult:
        """One create with retries; an ALREADY_EXISTS after our own retry means created."""
        tries = Tries(self.retry, attempts)
        while not isinstance(
            step := tries.create(request, key, await self._answer(request)), EnqueueResult
        ):
            await self._sleep(step)
        return step

    async def _answer(self, request: TaskRequest) -> EnqueueError | None:
        try:
            await self.transport.create_task(request, self.timeout)
        except EnqueueError as exc:
            return exc
        return None

    async def _send(self, tasks: Sequence[TaskRequest], batch_id: str) -> Sent:
        """One batch, its transient faults retried with the same ``request_id``."""
        tries = Tries(self.retry)
        while not isinstance(step := tries.batch(tasks, await self._batch(tasks, batch_id)), Sent):
            await self._sleep(step)
        return step

    async def _batch(
        self, tasks: Sequence[TaskRequest], batch_id: str
    ) -> BatchOutcome | EnqueueError:
        try:
            return await self.transport.create_tasks(tasks, batch_id, self.timeout)
        except EnqueueError as exc:
            return exc


async def _gather(calls: Sequence[Awaitable[T]], limit: asyncio.Semaphore) -> list[T]:
    """Await ``calls`` concurrently, at most ``limit`` at a time, their results in order."""

    async def limited(call: Awaitable[T]) -> T:
        async with limit:
            return await call

    return list(await asyncio.gather(*(limited(call) for call in calls)))


def grpc_endpoint(env: Mapping[str, str]) -> str | None:
    """The local emulator's gRPC address from the environment, or None (Google)."""
    explicit = env.get(GRPC_ENDPOINT_ENV)
    if explicit:
        return explicit
    rest = env.get("TASKLEASE_TASKS_ENDPOINT")
    if not rest:
        return None
    # tasklease.emulator.CloudTasksEmulator: gRPC defaults to the REST port + 1.
    parts = urlsplit(rest if "//" in rest else f"http://{rest}")
    if parts.port is None or parts.hostname is None:
        raise ValueError(
            f"TASKLEASE_TASKS_ENDPOINT={rest!r} names no port: set {GRPC_ENDPOINT_ENV} "
            "(host:port) for the async producer"
        )
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port + 1}"
