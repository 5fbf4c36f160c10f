"""Checked by mypy --strict (tests/worker/test_handler_typing.py): each line marked ``# E: <code>``
must be an error of that code, and no other line may be."""

from __future__ import annotations

from datetime import timedelta
from typing import TypedDict

from tasklease.worker import Router, TaskContext, create_app

router = Router()


class Order(TypedDict):
    order_id: int


def payload_only(payload: Order) -> None:
    return None


def job_with_payload(payload: Order, ctx: TaskContext) -> None:
    return None


def wrong_context(payload: Order, ctx: str) -> None:
    return None


router.task()(payload_only)  # E: arg-type
router.scheduled()(job_with_payload)  # E: arg-type
router.task()(wrong_context)  # E: arg-type


@router.task()
async def send_receipt(payload: Order, ctx: TaskContext) -> None:
    return None


send_receipt.enqueue({"order_id": "42"})  # E: typeddict-item
send_receipt.enqueue(42)  # E: arg-type
send_receipt.enqueue({"order_id": 42}, keys="order-42")  # E: call-arg
send_reciept.enqueue({"order_id": 42})  # E: name-defined  # noqa: F821 - the typo.

router.task(leese=timedelta(minutes=1))  # E: call-arg
router.task(lease=60)  # E: arg-type
router.task(manual_run_margin=timedelta(minutes=2))  # E: call-arg
create_app(router, audiance="https://worker.example")  # E: call-arg
