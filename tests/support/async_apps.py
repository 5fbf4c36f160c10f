"""Async handlers served by gunicorn in tests (imported by tasklease.worker.wsgi in children)."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from tasklease.errors import PermanentFailure
from tasklease.worker import Router, TaskContext

router = Router()


@router.task("slow_async")
async def slow_async(payload: Any, ctx: TaskContext) -> dict[str, int]:
    """Slow enough that concurrent deliveries overlap; one line per execution."""
    await asyncio.sleep(0.3)
    ctx.check_lease()
    line = f"{ctx.run_id} {os.getpid()} {threading.current_thread().name}\n"
    descriptor = os.open(
        os.path.join(os.environ["TEST_DIR"], "executions.log"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    )
    try:
        os.write(descriptor, line.encode())  # One small O_APPEND write: never interleaved.
    finally:
        os.close(descriptor)
    return {"pid": os.getpid()}


@router.task("refuse_async")
async def refuse_async(payload: Any, ctx: TaskContext) -> None:
    raise PermanentFailure("no such order")


@router.task("flaky_async")
async def flaky_async(payload: Any, ctx: TaskContext) -> str:
    if ctx.attempt == 1:
        raise ConnectionError("downstream down")
    return "sent"


@router.scheduled("async_job")
async def async_job(ctx: TaskContext) -> str:
    await asyncio.sleep(0)
    return "ran"
