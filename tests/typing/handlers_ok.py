"""Checked by mypy --strict (tests/worker/test_handler_typing.py): what the decorators' types let
through, and what they infer."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypedDict, assert_type

from tasklease.producer import EnqueueResult, Producer
from tasklease.worker import Router, TaskContext
from tasklease.worker.handlers.handles import JobHandler, TaskHandler

router = Router()


class Order(TypedDict):
    order_id: int


@router.task()
def send_receipt(payload: Order, ctx: TaskContext) -> dict[str, int]:
    return {"receipt_for": payload["order_id"]}


@router.task(queue="emails")
async def send_mail(payload: Order, ctx: TaskContext, retries: int = 3) -> None:
    return None


@router.scheduled()
def nightly(ctx: TaskContext) -> str:
    send_receipt.fan_out(ctx, [("a", {"order_id": 1})])
    return "done"


@router.scheduled()
async def hourly(ctx: TaskContext) -> int:
    return 1


def use(ctx: TaskContext, producer: Producer) -> None:
    assert_type(send_receipt, TaskHandler[Order, dict[str, int]])
    assert_type(send_mail, TaskHandler[Order, Coroutine[Any, Any, None]])
    assert_type(nightly, JobHandler[str])
    assert_type(hourly, JobHandler[Coroutine[Any, Any, int]])
    assert_type(send_receipt({"order_id": 1}, ctx), dict[str, int])
    assert_type(send_receipt.enqueue({"order_id": 42}, key="order-42"), EnqueueResult)
    send_mail.enqueue({"order_id": 42}, producer=producer, queue="urgent")
    send_receipt.enqueue_many([("a", {"order_id": 1})])
    producer.enqueue("billing-service-task", {"anything": "goes"})  # By name: unchecked.
