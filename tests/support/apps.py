"""Routers served by gunicorn in tests (imported by tasklease.worker.wsgi in child processes)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from tasklease.demo.ledger import Ledger
from tasklease.worker import Router, TaskContext

router = Router()


@router.task("slow_receipt")
def slow_receipt(payload: Any, ctx: TaskContext) -> dict[str, int]:
    """Slow enough that concurrent deliveries overlap; records each execution."""
    time.sleep(0.3)
    Ledger(os.environ["TEST_LEDGER"]).record("receipt", str(payload["order_id"]), ctx)
    return {"pid": os.getpid()}


@router.task("record")
def record(payload: Any, ctx: TaskContext) -> None:
    """One side effect per execution, for the end-to-end tests."""
    Ledger(os.environ["TEST_LEDGER"]).record("record", str(payload["n"]), ctx)


@router.task("outlives_deadline", lease=timedelta(seconds=6))
def outlives_deadline(payload: Any, ctx: TaskContext) -> None:
    """Runs past Cloud Tasks' 15 s minimum dispatch deadline on its first attempt."""
    if ctx.attempt == 1:
        time.sleep(17)
    Ledger(os.environ["TEST_LEDGER"]).record("slow", "one", ctx)


def _interval_log(kind: str, name: str, ctx: TaskContext, started: float) -> None:
    """Append one line per execution: what ran, in which process, from when to when
    (``time.monotonic()`` is one clock for every process of the host)."""
    line = f"{kind} {name} {ctx.run_id} {os.getpid()} {started:.6f} {time.monotonic():.6f}\n"
    descriptor = os.open(
        os.path.join(os.environ["TEST_DIR"], "intervals.log"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    )
    try:
        os.write(descriptor, line.encode())  # One small O_APPEND write: never interleaved.
    finally:
        os.close(descriptor)


def _held_until_the_test_says_go(name: str, ctx: TaskContext) -> dict[str, Any]:
    started = time.monotonic()
    directory = os.environ["TEST_DIR"]
    with open(os.path.join(directory, "started.log"), "a") as log:
        log.write(f"{ctx.run_id} {os.getpid()}\n")
    deadline = started + 25
    while not os.path.exists(os.path.join(directory, "go")) and time.monotonic() < deadline:
        time.sleep(0.02)
    _interval_log("job", name, ctx, started)
    return {"pid": os.getpid()}


@router.scheduled("exclusive_report", exclusive=True, max_runtime=timedelta(minutes=30))
def exclusive_report(ctx: TaskContext) -> dict[str, Any]:
    """An exclusive job that runs until the test creates the file ``go``."""
    return _held_until_the_test_says_go("exclusive_report", ctx)


@router.scheduled("exclusive_retry", exclusive=True, on_overlap="retry")
def exclusive_retry(ctx: TaskContext) -> dict[str, Any]:
    """The same, retried by the Scheduler on an overlap instead of skipped."""
    return _held_until_the_test_says_go("exclusive_retry", ctx)


@router.task("post_ledger", concurrency_key=lambda payload: payload["account_id"])
def post_ledger(payload: Any, ctx: TaskContext) -> None:
    """One posting per account at a time: records when it ran."""
    started = time.monotonic()
    time.sleep(0.01)
    _interval_log("task", str(payload["account_id"]), ctx, started)


@router.scheduled(
    "outlives_max_runtime",
    exclusive=True,
    on_overlap="retry",
    lease=timedelta(seconds=6),
    max_runtime=timedelta(seconds=2),
)
def outlives_max_runtime(ctx: TaskContext) -> dict[str, Any]:
    """An exclusive job that runs past its max_runtime (and its first lease), renewing."""
    return _held_until_the_test_says_go("outlives_max_runtime", ctx)


@router.scheduled(
    "crashes_holding",
    exclusive=True,
    on_overlap="retry",
    lease=timedelta(seconds=3),
    max_runtime=timedelta(seconds=8),
)
def crashes_holding(ctx: TaskContext) -> dict[str, Any]:
    """An exclusive job whose process the test kills while it holds the job."""
    return _held_until_the_test_says_go("crashes_holding", ctx)
