from __future__ import annotations

from django.test import Client
from shop import tasks
from shop.models import Order

from tasklease.testing.stubs import StubQueue
from tests.conftest import Worker, relay


def test_an_order_sends_one_receipt_whatever_the_queue_repeats(queue: StubQueue) -> None:
    placed = Client().post("/orders", data={"total": 990}, content_type="application/json")
    assert placed.status_code == 201
    assert queue.tasks == []  # Staged in the outbox with the order, not sent yet.
    assert relay(queue) == 1
    summary = queue.drain(Worker(), duplicate_every=1, lose_response_every=2)
    order = Order.objects.get(pk=placed.json()["order"])
    assert tasks.sent == [order.pk]
    assert order.receipt_sent
    assert summary.executions("django_task") == 1
    assert summary.outcomes["duplicate"] >= 1


def test_a_rolled_back_order_sends_no_receipt(queue: StubQueue) -> None:
    refused = Client().post("/orders", data={"total": 0}, content_type="application/json")
    assert refused.status_code == 400
    assert relay(queue) == 0
    assert queue.tasks == []
    assert tasks.sent == []
