"""The ASGI app's delivery threads: run a function in a thread, await its result on the loop.

asyncio's ``run_in_executor`` on a ``ThreadPoolExecutor`` spent ~13 us of CPU per call
(a ``concurrent.futures.Future`` with its condition, the pool's idle semaphore, two futures
chained through callbacks); one queue and one ``call_soon_threadsafe`` cost ~4 us here, on
every first execution (BENCHMARKS.md, "ASGI worker throughput").

Threads start as deliveries need them, up to ``size``; more wait in the queue, off the loop.
They are daemon threads, as the lease keeper's are: uvicorn's graceful shutdown waits for the
deliveries in flight (each awaits its thread), and one still running at exit ends as a crash
does, its lease running out and a retry running it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class _Job(Generic[T]):
    __slots__ = ("context", "function", "future", "loop")

    def __init__(
        self,
        function: Callable[[], T],
        context: contextvars.Context,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[T],
    ) -> None:
        self.function = function
        self.context = context
        self.loop = loop
        self.future = future


class DeliveryThreads:
    """At most ``size`` threads running functions for asyncio callers, in their context."""

    def __init__(self, size: int, name: str = "tasklease-delivery") -> None:
        if size < 1:
            raise ValueError(f"size={size!r}: at least 1")
        self.size = size
        self.name = name
        self._queue: SimpleQueue[_Job[Any] | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._started = 0
        self._idle = 0  # Threads waiting for a job and not yet promised one.
        self._closed = False

    @property
    def started(self) -> int:
        """How many threads have started (they never stop before :meth:`close`)."""
        return self._started

    async def run(self, function: Callable[[], T]) -> T:
        """``function()`` in one of the threads, in the caller's context (its trace)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        start = False
        with self._lock:
            if self._closed:
                raise RuntimeError("the delivery threads are closed")
            if self._idle:
                self._idle -= 1
            elif self._started < self.size:
                self._started += 1
                start = True
        if start:
            threading.Thread(
                target=self._serve, name=f"{self.name}_{self._started - 1}", daemon=True
            ).start()
        self._queue.put(_Job(function, contextvars.copy_context(), loop, future))
        return await future

    def close(self) -> None:
        """Stop every thread once the jobs queued before are done; refuse new ones."""
        with self._lock:
            self._closed = True
            started = self._started
        for _ in range(started):
            self._queue.put(None)

    def _serve(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            settle: Callable[[asyncio.Future[Any], Any], None]
            try:
                result = job.context.run(job.function)
            except BaseException as exc:  # Handed to the awaiting caller.
                settle, value = _fail, exc
            else:
                settle, value = _succeed, result
            # Idle before the caller learns the answer: its next job finds this thread.
            with self._lock:
                self._idle += 1
            _settle_soon(job, settle, value)
            del job, value  # Not held while waiting for the next one.


def _settle_soon(
    job: _Job[Any], settle: Callable[[asyncio.Future[Any], Any], None], value: Any
) -> None:
    with contextlib.suppress(RuntimeError):  # The loop closed: nobody awaits the answer.
        job.loop.call_soon_threadsafe(settle, job.future, value)


def _succeed(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():  # The caller may have been cancelled meanwhile.
        future.set_result(result)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
