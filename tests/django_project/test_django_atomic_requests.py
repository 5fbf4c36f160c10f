"""``ATOMIC_REQUESTS = True`` (a common Django setting) wraps every view in
``transaction.atomic()``, the worker's delivery views too. A task that wrote to the app's
database and then raised was answered 500 (released for a retry) by a view that *returned*,
so Django committed the failed attempt's writes, and the retry wrote them again. (And a task
that succeeded had its run recorded complete before its writes committed.) The delivery views
are not atomic requests; the task runs in the transaction instead, rolled back if it raises,
committed before its run is recorded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.test import Client

from tasklease.django import compat
from tasklease.producer import Producer
from tasklease.producer.memory import MemoryTransport, QueuedTask
from tests.django_project import tasks
from tests.django_project.conftest import WORKER_URL


@pytest.fixture
def queue(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryTransport]:
    transport = MemoryTransport()
    backend = compat.tasks.task_backends["default"]
    monkeypatch.setattr(
        backend, "producer", Producer("p", "l", worker_url=WORKER_URL, transport=transport)
    )
    tasks.CALLS.clear()
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS ledger (note TEXT)")
        cursor.execute("DELETE FROM ledger")
    yield transport


def _deliver(client: Client, queued: QueuedTask, retry: int) -> Any:
    """Deliver ``queued`` as Cloud Tasks would, as its ``retry``-th retry."""
    responses: list[Any] = []

    def post(path: str, headers: dict[str, str], data: bytes) -> Any:
        sent = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        sent["X-CloudTasks-TaskRetryCount"] = str(retry)
        sent["X-CloudTasks-TaskExecutionCount"] = str(retry)
        response = client.post(path, data=data, content_type="application/json", headers=sent)
        responses.append(response)
        return response

    MemoryTransport().deliver(queued, post, queued.request.queue_path.rsplit("/", 1)[-1])
    return responses[0]


def test_with_atomic_requests_a_failed_attempts_writes_are_not_kept_for_the_retry(
    queue: MemoryTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    tasks.ledger_entry.enqueue("order-42")
    (queued,) = queue.tasks
    client = Client()
    outcomes = [_deliver(client, queued, retry).headers["X-Tasklease-Outcome"] for retry in (0, 1)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM ledger")
        (rows,) = cursor.fetchone()
    assert (outcomes, rows) == (["released", "processed"], 1)
