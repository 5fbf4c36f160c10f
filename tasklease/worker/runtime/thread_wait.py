"""Awaiting a call that runs in a thread to its end, even when the awaiting task is cancelled.

A cancel stops a coroutine at its ``await``, never a function running in a thread (a step's
record being written, by ``ctx.astep``): the thread goes on, and its effect may land after the
task has moved on (its run released for a retry). So the task waits for the thread's outcome
first, then goes on being cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def thread_result(awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result (a thread's call); a cancel that came meanwhile is raised once
    the call has ended."""
    pending = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not pending.done():
        try:
            await asyncio.wait({pending})  # Never cancels ``pending``, never raises its error.
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        if not pending.cancelled():
            pending.exception()  # Retrieved: the cancel is what goes on.
        raise cancelled
    return pending.result()
