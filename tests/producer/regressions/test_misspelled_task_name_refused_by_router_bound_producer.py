"""A misspelt ``enqueue("send_confirmaton", ...)`` returned ``created=True``; the task was then
answered 404 up to 100 times and never showed in ``tasklease runs``. A producer given the
worker's router refuses a name no task handler has, before any network call."""

from __future__ import annotations

from typing import Any

import pytest

from tasklease.producer import InvalidTask, MemoryTransport, Producer
from tasklease.worker import Router, TaskContext


def test_a_producer_given_the_router_refuses_a_name_it_has_no_handler_for() -> None:
    router = Router()

    @router.task()
    def send_confirmation(payload: Any, ctx: TaskContext) -> None:
        return None

    transport = MemoryTransport()
    producer = Producer(
        "p", "us-central1", "default", "https://worker.test", transport=transport, router=router
    )
    with pytest.raises(InvalidTask, match="no task handler"):
        producer.enqueue("send_confirmaton", {"order_id": 42}, key="order-42")
    assert transport.tasks == []
    assert producer.enqueue("send_confirmation", {"order_id": 42}, key="order-42").created
