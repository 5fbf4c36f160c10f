from __future__ import annotations

import requests
from shop import tasks

from tasklease.testing.stubs import StubQueue
from tests.conftest import Http


def test_an_order_sends_one_receipt_whatever_the_queue_repeats(
    server: Http, queue: StubQueue
) -> None:
    first = requests.post(f"{server.url}/orders", json={"order_id": 42}, timeout=30)
    again = requests.post(f"{server.url}/orders", json={"order_id": 42}, timeout=30)
    assert first.json() == {"created": True}
    assert again.json() == {"created": False}  # A retried request: the key absorbed it.
    summary = queue.drain(server, duplicate_every=1, lose_response_every=2)
    assert [order for order, _ in tasks.sent] == [42]
    assert summary.executions("send_receipt") == 1
    assert summary.outcomes["duplicate"] >= 1


def test_an_order_that_does_not_exist_fails_once_and_is_not_retried(
    server: Http, queue: StubQueue
) -> None:
    requests.post(f"{server.url}/orders", json={"order_id": 0}, timeout=30)
    assert queue.drain(server).outcomes == {"failed": 1}
    assert tasks.sent == []


def test_the_worker_answers_under_its_mount(server: Http) -> None:
    assert requests.get(f"{server.url}/worker/healthz", timeout=10).json() == {"status": "ok"}
