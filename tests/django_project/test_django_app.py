"""tasklease.django end to end: Django tasks enqueued through the backend (directly, or
through the outbox inside ``transaction.atomic()``), delivered to the worker's Django view
with Django's test client, run once under tasklease's claim."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client, override_settings
from django.utils import timezone

from tasklease.django import DJANGO_TASK_HANDLER, compat
from tasklease.outbox import Relay, open_outbox
from tasklease.outbox.relay import Round
from tasklease.producer import Producer
from tasklease.producer.memory import MemoryTransport
from tasklease.worker.auth.authenticators import OidcAuth
from tests.django_project import tasks
from tests.django_project.conftest import OUTBOX_URL, WORKER_URL, deliver


@pytest.fixture
def queue(queue: MemoryTransport) -> Iterator[MemoryTransport]:
    """The room's queue; the outbox emptied after the test."""
    yield queue
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM tasklease_outbox")


def _producer(transport: MemoryTransport) -> Producer:
    return Producer("p", "l", worker_url=WORKER_URL, transport=transport)


def _relay(transport: MemoryTransport) -> Round:
    """Relay every due outbox entry of the app's database into ``transport``."""
    db = open_outbox(OUTBOX_URL)
    try:
        return Relay(db, _producer(transport)).drain()
    finally:
        db.close()


def _outbox_rows() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM tasklease_outbox")
        (count,) = cursor.fetchone()
    return int(count)


def test_an_enqueue_outside_a_transaction_creates_the_cloud_task_at_once(
    queue: MemoryTransport,
) -> None:
    result = tasks.record.enqueue("hello")
    assert result.status == compat.TaskResultStatus.READY
    [created] = queue.tasks
    assert created.request.url == f"{WORKER_URL}/tasks/{DJANGO_TASK_HANDLER}"
    assert created.request.queue_path.endswith("/queues/default")
    assert _outbox_rows() == 0


def test_a_delivery_runs_the_task_once_and_a_duplicate_is_answered_from_the_record(
    queue: MemoryTransport,
) -> None:
    tasks.record.enqueue("once")
    [created] = queue.tasks
    client = Client()
    first = deliver(client, created)
    assert first.status_code == 200, first.content
    assert first.headers["X-Tasklease-Outcome"] == "processed"
    second = deliver(client, created)
    assert second.status_code == 200
    assert second.headers["X-Tasklease-Outcome"] == "duplicate"
    assert tasks.CALLS == ["once"]


def test_an_enqueue_in_a_rolled_back_atomic_block_creates_nothing(
    queue: MemoryTransport,
) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.record.enqueue("never")
        assert _outbox_rows() == 1  # Staged through the transaction, not sent.
        raise RuntimeError("roll back")
    assert _outbox_rows() == 0
    assert queue.tasks == []
    drained = _relay(queue)
    assert drained.sent == 0
    assert queue.tasks == []


def test_an_enqueue_in_a_committed_atomic_block_is_staged_and_the_relay_sends_it(
    queue: MemoryTransport,
) -> None:
    with transaction.atomic():
        result = tasks.record.enqueue("committed")
        assert queue.tasks == []  # Nothing leaves before the commit.
    assert _outbox_rows() == 1
    assert queue.tasks == []
    relayed = _relay(queue)
    assert relayed.sent == 1
    [created] = queue.tasks
    response = deliver(Client(), created)
    assert response.headers["X-Tasklease-Outcome"] == "processed"
    assert tasks.CALLS == ["committed"]
    assert result.id in created.request.body.decode()


def test_run_after_queue_name_and_takes_context_reach_cloud_tasks_and_the_task(
    queue: MemoryTransport,
) -> None:
    when = timezone.now() + timedelta(minutes=5)
    tasks.email.using(run_after=when).enqueue("a@example.com")
    tasks.with_context.enqueue("ctx")
    email, with_context = queue.tasks
    assert email.request.queue_path.endswith("/queues/emails")
    assert email.request.schedule_time == when
    client = Client()
    assert deliver(client, email).status_code == 200
    assert deliver(client, with_context).status_code == 200
    assert tasks.CALLS == [("email", "a@example.com"), ("ctx", 1)]


def test_an_async_task_is_awaited(queue: MemoryTransport) -> None:
    tasks.async_record.enqueue("awaited")
    [created] = queue.tasks
    response = deliver(Client(), created)
    assert response.headers["X-Tasklease-Outcome"] == "processed"
    assert tasks.CALLS == [("async", "awaited")]


def test_a_priority_or_arguments_that_are_not_json_are_refused(queue: MemoryTransport) -> None:
    with pytest.raises(compat.InvalidTask, match="priority"):
        compat.tasks.task(priority=10)(tasks.plain).enqueue()
    with pytest.raises(compat.InvalidTask, match="JSON"):
        tasks.record.enqueue(object())
    assert queue.tasks == []


def test_an_unauthenticated_delivery_is_refused_and_runs_nothing(queue: MemoryTransport) -> None:
    tasks.record.enqueue("forged")
    [created] = queue.tasks
    auth = OidcAuth(["tasks@p.iam.gserviceaccount.com"], audience=WORKER_URL)
    with override_settings(TASKLEASE_AUTH=auth):
        response = deliver(Client(), created)
    assert response.status_code == 401
    assert response.headers["X-Tasklease-Outcome"] == "unauthenticated"
    assert tasks.CALLS == []


def test_a_payload_naming_something_that_is_not_a_django_task_is_never_called(
    queue: MemoryTransport,
) -> None:
    backend = compat.tasks.task_backends["default"]
    backend.producer.enqueue(DJANGO_TASK_HANDLER, {"task": "os.getcwd", "args": []}, key="k")
    [created] = queue.tasks
    response = deliver(Client(), created)
    assert response.status_code == 200
    assert response.headers["X-Tasklease-Outcome"] == "failed"


def test_a_task_that_raises_is_answered_for_a_retry_which_runs_it_again(
    queue: MemoryTransport,
) -> None:
    tasks.flaky.enqueue("retried")
    [created] = queue.tasks
    client = Client()
    failed = deliver(client, created)
    assert failed.status_code >= 500
    retried = deliver(client, created)
    assert retried.headers["X-Tasklease-Outcome"] == "processed"
    assert deliver(client, created).headers["X-Tasklease-Outcome"] == "duplicate"
    assert tasks.CALLS == [("flaky", "retried"), ("flaky", "retried")]


def test_aenqueue_creates_the_task_from_async_code(queue: MemoryTransport) -> None:
    result = asyncio.run(tasks.record.aenqueue("from async"))
    [created] = queue.tasks
    assert result.id in created.request.body.decode()


def test_get_result_says_where_results_live(queue: MemoryTransport) -> None:
    with pytest.raises(NotImplementedError, match="run record"):
        tasks.record.get_result("any-id")


def test_a_delivery_sends_djangos_task_started_and_task_finished_signals(
    queue: MemoryTransport,
) -> None:
    """Django's task_started and task_finished (its own logging, and apps' monitoring, hang
    on them) for each attempt: a failed one with its error, the retry with its result."""
    seen: list[tuple[Any, ...]] = []

    def started(sender: type, task_result: Any, **_: Any) -> None:
        seen.append(("started", sender, task_result.status, task_result.attempts))

    def finished(sender: type, task_result: Any, **_: Any) -> None:
        errors = [error.exception_class_path for error in task_result.errors]
        value = task_result.return_value if not errors else None
        seen.append(("finished", task_result.status, errors, value, task_result.is_finished))

    compat.signals.task_started.connect(started)
    compat.signals.task_finished.connect(finished)
    try:
        tasks.flaky.enqueue("signalled")
        [created] = queue.tasks
        client = Client()
        assert deliver(client, created).status_code >= 500
        assert deliver(client, created).headers["X-Tasklease-Outcome"] == "processed"
    finally:
        compat.signals.task_started.disconnect(started)
        compat.signals.task_finished.disconnect(finished)
    backend = type(compat.tasks.task_backends["default"])
    status = compat.TaskResultStatus
    assert seen == [
        ("started", backend, status.RUNNING, 1),
        ("finished", status.FAILED, ["builtins.ConnectionError"], None, True),
        ("started", backend, status.RUNNING, 2),
        ("finished", status.SUCCESSFUL, [], "signalled", True),
    ]
