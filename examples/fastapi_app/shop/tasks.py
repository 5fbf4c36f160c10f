"""The handlers: ``send_receipt`` runs once per order, however often Cloud Tasks delivers it."""

from __future__ import annotations

from typing import TypedDict

from tasklease import PermanentFailure, Router, TaskContext

router = Router()
sent: list[tuple[int, str]] = []  # Stands in for a mail API, with the key it deduplicates on.


class Order(TypedDict):
    order_id: int


@router.task()
async def send_receipt(payload: Order, ctx: TaskContext) -> dict[str, int]:
    """An ``async def`` handler: awaited on tasklease's handler loop, off the server's."""
    if payload["order_id"] <= 0:
        raise PermanentFailure(f"no such order: {payload['order_id']}")  # Recorded; no retry.
    sent.append((payload["order_id"], ctx.idempotency_key))
    return {"order_id": payload["order_id"]}
