"""``ATOMIC_REQUESTS = True`` (a common Django setting) wraps every view in
``transaction.atomic()``, the worker's delivery views too. A task that wrote to the app's
database and then raised was answered 500 (released for a retry) by a view that *returned*,
so Django committed the failed attempt's writes, and the retry wrote them again. (And a task
that succeeded had its run recorded complete before its writes committed.) The delivery views
are not atomic requests; the task runs in the transaction instead, rolled back if it raises,
committed before its run is recorded."""

from __future__ import annotations

import pytest
from django.db import connection, connections
from django.test import Client

from tasklease.producer.memory import MemoryTransport
from tests.django_project import tasks
from tests.django_project.conftest import deliver


@pytest.fixture
def queue(queue: MemoryTransport) -> MemoryTransport:
    """The room's queue, and an empty ledger table."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS ledger (note TEXT)")
        cursor.execute("DELETE FROM ledger")
    return queue


def test_with_atomic_requests_a_failed_attempts_writes_are_not_kept_for_the_retry(
    queue: MemoryTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    tasks.ledger_entry.enqueue("order-42")
    (queued,) = queue.tasks
    client = Client()
    outcomes = [deliver(client, queued, retry).headers["X-Tasklease-Outcome"] for retry in (0, 1)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM ledger")
        (rows,) = cursor.fetchone()
    assert (outcomes, rows) == (["released", "processed"], 1)
