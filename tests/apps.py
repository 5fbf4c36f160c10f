"""Routers served by gunicorn in tests (imported by worker.wsgi in the child processes)."""

from __future__ import annotations

import os
import time
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
