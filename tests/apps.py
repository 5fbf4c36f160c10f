"""Routers served by gunicorn in tests (imported by worker.wsgi in the child processes)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from examples.ledger import Ledger
from worker import Router, TaskContext

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
