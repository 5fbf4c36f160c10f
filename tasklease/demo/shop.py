"""The example shop: a receipt per order, and each night a report per customer.

Run it under gunicorn with ``TASKLEASE_ROUTER=tasklease.demo.shop:router``. Orders enqueue
``send_receipt`` keyed by order id; the Cloud Scheduler job ``nightly_reports`` fans out one
``send_report`` task per customer, keyed by the scheduled run; the job ``nightly_export``
starts the ``nightly-export`` workflow once per night, through the worker rather than straight
from Cloud Scheduler, so a retried run does not start it twice.

``export_orders`` is long work as a chain of short deliveries: one durable step per page,
then ``ctx.continue_later`` with the next page, until the last page completes the run.

Two handlers show mutual exclusion: ``reconcile_stock`` is an exclusive job (never two runs
at once, whichever timer or manual run fires it), and ``post_ledger`` posts each order to its
customer's account, one posting per account at a time (``concurrency_key``).

``charge_order`` moves each order's amount between two ledger rows in the lease store's own
SQLite database, transactionally (``transactional=True``, :mod:`tasklease.demo.transfers`).
"""

from __future__ import annotations

import functools
import os
import time
from datetime import timedelta
from typing import Any

from tasklease.demo import has_workflows_client, transfers
from tasklease.demo.ledger import Ledger
from tasklease.producer import Producer
from tasklease.worker import PermanentFailure, Router, TaskContext
from tasklease.worker.targets import workflows_execution

CUSTOMERS = [f"customer-{n:03d}" for n in range(int(os.environ.get("SHOP_CUSTOMERS", "25")))]

router = Router()


@functools.cache
def ledger() -> Ledger:
    return Ledger(os.environ.get("SHOP_LEDGER", "shop-ledger.db"))


@functools.cache
def producer() -> Producer:
    """Configured by TASKLEASE_* variables (see producer.Producer.from_env)."""
    return Producer.from_env()


@router.task("send_receipt")
def send_receipt(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Email the receipt of one order."""
    order_id = payload.get("order_id")
    if not isinstance(order_id, int):
        raise PermanentFailure(f"payload has no integer order_id: {payload!r}")
    ledger().record("receipt", f"order-{order_id}", ctx)
    return {"receipt_sent_for": order_id}


@router.scheduled("nightly_reports")
def nightly_reports(ctx: TaskContext) -> dict[str, int]:
    """Fan out one report task per customer; a re-delivered run re-creates none."""
    assert ctx.schedule_time is not None
    night = ctx.schedule_time.date().isoformat()
    ledger().record("nightly_run", ctx.schedule_time.isoformat(), ctx)
    items = [(customer, {"customer": customer, "night": night}) for customer in CUSTOMERS]
    # If a child cannot be created, fan_out raises FanOutIncomplete once it tried them all:
    # the run is released, and the Scheduler's retry creates only the missing children.
    results = producer().fan_out(ctx, "send_report", items)
    return {"reports": len(results), "created": sum(result.created for result in results)}


@router.task("export_orders")
def export_orders(payload: dict[str, Any], ctx: TaskContext) -> dict[str, int] | None:
    """Export one page of orders per delivery: a retried delivery does not export its page
    twice (a durable step), and the next page is a continuation of the same run."""
    page = int((ctx.state or {"page": 0})["page"])
    ctx.step(f"page-{page}", ledger().record, "export_page", f"page-{page}", ctx)
    if page + 1 < int(payload["pages"]):
        ctx.continue_later({"page": page + 1})
        return None
    return {"pages_exported": page + 1}


@router.task("send_report")
def send_report(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Email one customer's nightly report."""
    ledger().record("report", f"{payload['night']}/{payload['customer']}", ctx)


@router.scheduled(
    "reconcile_stock",
    exclusive=True,
    max_runtime=timedelta(hours=2),
    min_gap=timedelta(minutes=5),
    on_overlap="skip",
)
def reconcile_stock(ctx: TaskContext) -> dict[str, str]:
    """Recount the stock. Two runs at once would double-count: a run that finds another
    still going (a second timer, a manual run, the next tick) is skipped and recorded."""
    with ledger().exclusive("stock_reconcile", "warehouse"):
        time.sleep(float(os.environ.get("SHOP_RECONCILE_SECONDS", "1")))
        ledger().record("stock_reconcile", "warehouse", ctx)
    return {"reconciled": "warehouse"}


@router.task("post_ledger", concurrency_key=lambda payload: payload["account_id"])
def post_ledger(payload: dict[str, Any], ctx: TaskContext) -> None:
    """Post one order to its customer's account: a read-modify-write of the balance, so two
    postings to one account must not interleave; other accounts post in parallel."""
    with ledger().exclusive("posting", payload["account_id"]):
        time.sleep(0.01)  # Reading and writing the balance.
        ledger().record("posting", f"order-{payload['order_id']}", ctx)


@router.task("charge_order", transactional=True)
def charge_order(payload: dict[str, Any], ctx: TaskContext) -> dict[str, int]:
    """Move the order's amount from the wallets to the till: in the run's own transaction,
    so the move and the run's completion record commit together, or neither does."""
    order_id = payload.get("order_id")
    if not isinstance(order_id, int):
        raise PermanentFailure(f"payload has no integer order_id: {payload!r}")
    return {"charged": transfers.move(ctx.transaction, order_id, ctx.run_id)}


# The Scheduler job targets the worker, which claims the run and then calls Workflows with
# the run's key in the argument ({"tasklease": {"idempotency_key": ...}}). Needs
# tasklease[workflows] (the demo leaves the job out without it); TASKLEASE_WORKFLOWS_EMULATOR_HOST
# points it at a local fake.
if has_workflows_client():
    router.proxy_job(
        "nightly_export",
        target=workflows_execution(
            f"projects/{os.environ.get('TASKLEASE_PROJECT', 'my-project')}/locations/"
            f"{os.environ.get('TASKLEASE_LOCATION', 'us-central1')}/workflows/nightly-export",
            argument={"format": "parquet", "customers": len(CUSTOMERS)},
        ),
    )
