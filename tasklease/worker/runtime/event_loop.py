"""The event loop that runs ``async def`` handlers under a threaded WSGI server (gunicorn).

One loop per process, on a daemon thread of its own, started on first use and again after a
fork (gunicorn forks its workers from a master that may have imported the app). The request
thread that claimed the run hands the handler's coroutine to the loop and waits for it, inside
the lease keeper's ``with`` block, so claim, renewal, fencing and finish are the sync path's.
Only the handler runs on the loop: every store call (claim, renewal, finish) stays on the
request thread or the keeper's threads, so none ever blocks the loop.

One loop rather than ``asyncio.run`` per delivery: loop-bound clients a handler keeps between
deliveries (an ``httpx.AsyncClient``, an ``asyncpg`` pool) keep working, concurrent async
handlers share the loop instead of each thread building and tearing down its own, and a
hand-off costs a cross-thread wake-up rather than a loop's creation (``BENCHMARKS.md``). The
price is asyncio's own: an ``async def`` handler that blocks (``time.sleep``, a sync client)
stalls the other async handlers of its process, though never the sync ones nor the renewals.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import logging
import os
import threading
from collections.abc import Awaitable
from concurrent.futures import Future
from typing import TypeVar

from tasklease.worker.core.endings import HandlerNotStarted

_T = TypeVar("_T")
_log = logging.getLogger("tasklease.event_loop")


class LoopNotStarted(HandlerNotStarted):
    """The loop's thread could not be started: the handler's coroutine never ran, so its
    claim is given back without counting the attempt."""


class HandlerCancelled(Exception):
    """The handler's task was cancelled (by the handler's own code or a library it awaits):
    an ordinary failure, released for a retry, rather than a ``BaseException`` escaping the
    worker."""


class HandlerLoop:
    """A process's event loop for handlers, on a thread of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # asyncio keeps only weak references.

    @property
    def thread(self) -> threading.Thread | None:
        """The loop's thread in this process, once started."""
        return self._thread if self._pid == os.getpid() else None

    def run(self, awaitable: Awaitable[_T]) -> _T:
        """Await ``awaitable`` on the loop and return its result (or raise its exception),
        in the calling thread's context (its log fields and trace), blocking that thread.
        Raises :class:`LoopNotStarted` without awaiting it if the loop cannot start."""
        try:
            loop = self._started()
        except LoopNotStarted:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()  # Never started: no "never awaited" warning.
            raise
        done: Future[_T] = Future()
        context = contextvars.copy_context()

        def start() -> None:
            task = loop.create_task(_settle(awaitable, done), context=context)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        loop.call_soon_threadsafe(start)
        return done.result()

    def _started(self) -> asyncio.AbstractEventLoop:
        pid = os.getpid()
        if self._pid == pid and self._loop is not None:
            return self._loop
        with self._lock:
            if self._pid == pid and self._loop is not None:
                return self._loop
            # After a fork the parent's loop thread does not exist here: start afresh.
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=_serve, args=(loop,), name="tasklease-handler-loop", daemon=True
            )
            try:
                thread.start()
            except Exception as exc:  # e.g. "can't start new thread"
                loop.close()
                _log.error("could not start the handler event loop's thread: %s", exc)
                raise LoopNotStarted(f"the handler event loop could not start: {exc}") from exc
            self._loop, self._thread, self._tasks = loop, thread, set()
            self._pid = pid
            return loop

    def close(self) -> None:
        """Stop the loop and close it (at exit); handlers still running are abandoned."""
        with self._lock:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None or self._pid != os.getpid():
                return
            self._loop = self._thread = self._pid = None
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=1.0)
        if not thread.is_alive():
            loop.close()


async def _settle(awaitable: Awaitable[_T], done: Future[_T]) -> None:
    """Await the handler and hand its result or exception to the waiting request thread.
    Every exception is handed over, never raised here: one escaping a task would be logged
    and lost, and a ``SystemExit`` would stop the loop itself."""
    try:
        result = await awaitable
    except asyncio.CancelledError:
        done.set_exception(HandlerCancelled("the handler's task was cancelled"))
    except BaseException as exc:  # Raised again in the request thread.
        done.set_exception(exc)
    else:
        done.set_result(result)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


HANDLER_LOOP = HandlerLoop()
atexit.register(HANDLER_LOOP.close)
