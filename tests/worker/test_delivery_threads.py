"""The ASGI app's delivery threads: functions run off the loop, in the caller's context, at
most ``size`` at once, their results and errors handed back to the awaiting caller."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from functools import partial

import pytest

from tasklease.worker.runtime.delivery_threads import DeliveryThreads

TRACE: contextvars.ContextVar[str] = contextvars.ContextVar("trace", default="none")


def test_a_function_runs_in_a_thread_in_the_callers_context_and_its_result_comes_back() -> None:
    threads = DeliveryThreads(4)

    async def main() -> tuple[int, str, int]:
        TRACE.set("caller's")
        return await threads.run(lambda: (threading.get_ident(), TRACE.get(), 42))

    try:
        ran_on, trace, result = asyncio.run(main())
    finally:
        threads.close()
    assert ran_on != threading.get_ident()
    assert (trace, result) == ("caller's", 42)


def test_an_error_in_the_thread_is_raised_to_the_awaiting_caller() -> None:
    threads = DeliveryThreads(1)

    def broken() -> None:
        raise LookupError("in the thread")

    async def main() -> None:
        await threads.run(broken)

    try:
        with pytest.raises(LookupError, match="in the thread"):
            asyncio.run(main())
    finally:
        threads.close()


def test_no_more_than_size_threads_run_at_once_and_the_rest_wait_their_turn() -> None:
    threads = DeliveryThreads(3)
    lock = threading.Lock()
    running = 0
    most = 0
    names: set[str] = set()

    def work(n: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            names.add(threading.current_thread().name)
        time.sleep(0.005)
        with lock:
            running -= 1
        return n

    async def main() -> list[int]:
        return list(await asyncio.gather(*(threads.run(partial(work, n)) for n in range(30))))

    try:
        assert asyncio.run(main()) == list(range(30))
    finally:
        threads.close()
    assert most <= 3
    assert threads.started <= 3
    assert len(names) == threads.started
    assert all(name.startswith("tasklease-delivery_") for name in names)


def test_idle_threads_are_reused_rather_than_new_ones_started() -> None:
    threads = DeliveryThreads(8)

    async def main() -> None:
        for _ in range(20):
            await threads.run(lambda: None)

    try:
        asyncio.run(main())
    finally:
        threads.close()
    assert threads.started == 1


def test_closed_threads_finish_what_was_queued_stop_and_refuse_more() -> None:
    threads = DeliveryThreads(2, name="closing")

    async def main() -> None:
        await asyncio.gather(*(threads.run(lambda: None) for _ in range(4)))
        threads.close()
        with pytest.raises(RuntimeError, match="closed"):
            await threads.run(lambda: None)

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while any(t.name.startswith("closing_") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the delivery threads did not stop"
        time.sleep(0.01)


def test_a_caller_cancelled_while_its_function_runs_leaves_the_thread_serving() -> None:
    threads = DeliveryThreads(1)
    release = threading.Event()

    async def main() -> int:
        waiting = asyncio.ensure_future(threads.run(lambda: release.wait(10)))
        await asyncio.sleep(0.01)
        waiting.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return await threads.run(lambda: 7)

    try:
        assert asyncio.run(main()) == 7
    finally:
        threads.close()
