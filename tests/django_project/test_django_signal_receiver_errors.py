"""A receiver of Django's ``task_finished`` that raises (an app's monitoring hook whose own
store is down) is reported, not raised into the run: the task's outcome is already decided,
and an exception there would release a run whose effects happened, so the queue's retry would
run the task again (or turn a dead letter into retries)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from tasklease.django import compat
from tasklease.producer.memory import MemoryTransport
from tests.django_project import tasks
from tests.django_project.conftest import deliver


@pytest.fixture
def queue(queue: MemoryTransport) -> Iterator[MemoryTransport]:
    """The room's queue; the outbox emptied after the test."""
    yield queue
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM tasklease_outbox")


@pytest.fixture
def broken_receiver() -> Iterator[None]:
    def finished(sender: type, task_result: Any, **_: Any) -> None:
        raise RuntimeError("the metrics database is down")

    compat.signals.task_finished.connect(finished)
    try:
        yield
    finally:
        compat.signals.task_finished.disconnect(finished)


def test_a_raising_task_finished_receiver_neither_fails_the_delivery_nor_reruns_the_task(
    queue: MemoryTransport, broken_receiver: None
) -> None:
    tasks.record.enqueue("once")
    [created] = queue.tasks
    client = Client()
    first = deliver(client, created)
    # A 200 stops the queue; whatever the first answer, its retry (or a duplicate) must
    # find the run settled and not run the task again.
    again = deliver(client, created)
    assert tasks.CALLS == ["once"]
    assert (first.status_code, first.headers["X-Tasklease-Outcome"]) == (200, "processed")
    assert again.status_code == 200


def test_a_raising_task_finished_receiver_keeps_a_permanent_failure_a_dead_letter(
    queue: MemoryTransport, broken_receiver: None
) -> None:
    tasks.doomed.enqueue("bad")
    [created] = queue.tasks
    reply = deliver(Client(), created)
    assert reply.status_code == 200
    assert reply.headers["X-Tasklease-Outcome"] == "failed"
    assert tasks.CALLS == [("doomed", "bad")]
