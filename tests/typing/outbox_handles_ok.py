"""Checked by mypy --strict
(tests/producer/regressions/test_handle_enqueue_many_takes_a_transaction_typed.py): every
enqueue of a handle takes ``transaction=``, as the producer's own do."""

from __future__ import annotations

import sqlite3
from typing import TypedDict

from tasklease.producer import EnqueueResult
from tasklease.worker import Router, TaskContext

router = Router()


class Order(TypedDict):
    order_id: int


@router.task()
def send_receipt(payload: Order, ctx: TaskContext) -> None:
    return None


def place_orders(conn: sqlite3.Connection) -> list[EnqueueResult]:
    one = send_receipt.enqueue({"order_id": 1}, key="o1", transaction=conn)
    many = send_receipt.enqueue_many([("o2", {"order_id": 2})], transaction=conn)
    return [one, *many]


@router.scheduled()
def nightly(ctx: TaskContext) -> None:
    with sqlite3.connect("app.db") as conn:
        send_receipt.fan_out(ctx, [("a", {"order_id": 1})], transaction=conn)
