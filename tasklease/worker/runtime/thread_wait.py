"""Awaiting a call that runs in a thread to its end, even when the awaiting task is cancelled.

A cancel stops a coroutine at its ``await``, never a function running in a thread (a
continuation's enqueue, a step's record being written): the thread goes on, and its effect
may land after the task has moved on (released the run it was writing for). So the task
waits for the thread's outcome first, then goes on being cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def to_its_end(
    awaitable: Awaitable[T],
) -> tuple[asyncio.Future[T], asyncio.CancelledError | None]:
    """``awaitable``, done, and the cancellation of the awaiting task if one came meanwhile."""
    pending = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not pending.done():
        try:
            await asyncio.wait({pending})  # Never cancels ``pending``, never raises its error.
        except asyncio.CancelledError as exc:
            cancelled = exc
    return pending, cancelled


async def thread_result(awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result (a thread's call); a cancel that came meanwhile is raised once
    the call has ended."""
    done, cancelled = await to_its_end(awaitable)
    if cancelled is not None:
        if not done.cancelled():
            done.exception()  # Retrieved: the cancel is what goes on.
        raise cancelled
    return done.result()
