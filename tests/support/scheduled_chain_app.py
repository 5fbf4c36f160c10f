"""A worker router served by gunicorn in the scheduled-continuation tests: a nightly job
that runs as a chain of deliveries, one durable step each, its effects in a ledger."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from tasklease.worker import Router, TaskContext
from tests.faults.steps_ledger import StepsLedger

router = Router()


@router.scheduled("nightly", queue="reports", lease=timedelta(seconds=5))
def nightly(ctx: TaskContext) -> dict[str, Any] | None:
    """Page ``ctx.state["page"]`` of ``CHAIN_PAGES`` per delivery: continues until the last."""
    ledger = StepsLedger(os.environ["CHAIN_LEDGER"])
    page = int((ctx.state or {"page": 0})["page"])

    def export(name: str) -> bool:
        ledger.called(ctx.run_id, name, ctx.attempt_id)
        return ledger.apply(ctx.run_id, name, ctx.attempt_id, ctx.step_key(name))

    ctx.step(f"page-{page}", export, f"page-{page}")
    if page + 1 < int(os.environ["CHAIN_PAGES"]):
        ctx.continue_later({"page": page + 1})
        return None
    return {"pages": page + 1, "job": ctx.job_name, "slot": str(ctx.schedule_time)}
