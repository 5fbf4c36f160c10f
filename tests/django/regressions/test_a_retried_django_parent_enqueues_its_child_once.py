"""Finding: ``CloudTasksBackend.enqueue`` named every new task with a fresh ``uuid4``, so a
parent task retried after its enqueue happened (a transient error after it, or a kill after
its ``atomic()`` block committed and before the run was recorded) created a second child
under a new name, and the child ran twice. Inside a tasklease handler the n-th enqueue of a
task now has a key derived from the run: every attempt names the same child. Outside a
handler each ``enqueue()`` is a new task, as in Django's own backends.

The test project's Django (tests/django_project) with an in-memory Cloud Tasks queue behind
the backend; deliveries go to the worker's Django view through Django's test client, as
Cloud Tasks would send them (a retry count that grows)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client, override_settings

from tasklease.django import compat
from tasklease.outbox import Relay, open_outbox
from tasklease.producer import Producer
from tasklease.producer.memory import MemoryTransport, QueuedTask
from tasklease.worker import Router, TaskContext
from tests.django_project import conftest, tasks  # conftest first: it configures Django.

RECORD = "tests.django_project.tasks.record"
PARENT_RESULTS: list[str] = []  # The result id each attempt of a parent's enqueue returned.

ROUTER = Router()  # Plain tasklease handlers, served beside the Django task handler.


@compat.tasks.task
def parent(order: str) -> None:
    """Enqueues its child, then fails its first attempt: the queue's retry runs it again."""
    PARENT_RESULTS.append(tasks.record.enqueue(f"receipt {order}").id)
    if len(PARENT_RESULTS) == 1:
        raise ConnectionError("the parent's first attempt fails after its enqueue")


@compat.tasks.task
def atomic_parent(order: str) -> None:
    """Enqueues its child inside ``atomic()`` (through the outbox), then fails its first
    attempt after the block committed: as a parent killed before its run was recorded."""
    with transaction.atomic():
        PARENT_RESULTS.append(tasks.record.enqueue(f"receipt {order}").id)
    if len(PARENT_RESULTS) == 1:
        raise ConnectionError("the parent's first attempt fails after its commit")


@compat.tasks.task
async def async_parent(order: str) -> None:
    """An ``async def`` parent: its child enqueued with ``aenqueue``."""
    PARENT_RESULTS.append((await tasks.record.aenqueue(f"receipt {order}")).id)
    if len(PARENT_RESULTS) == 1:
        raise ConnectionError("the parent's first attempt fails after its enqueue")


@ROUTER.task("ship")
def ship(payload: Any, ctx: TaskContext) -> None:
    """A plain handler enqueuing the same Django task three times: once in a step, twice
    beside it. The retry replays the step (its function is not called again)."""
    ctx.step("label", lambda: tasks.record.enqueue(f"label {payload}").id)
    PARENT_RESULTS.append(tasks.record.enqueue(f"invoice {payload}").id)
    PARENT_RESULTS.append(tasks.record.enqueue(f"invoice copy {payload}").id)
    if ctx.attempt == 1:
        raise ConnectionError("the first attempt fails after its enqueues")


@pytest.fixture
def queue(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryTransport]:
    """A fresh in-memory Cloud Tasks queue behind the default backend's producer."""
    transport = MemoryTransport()
    monkeypatch.setattr(compat.tasks.task_backends["default"], "producer", _producer(transport))
    tasks.CALLS.clear()
    PARENT_RESULTS.clear()
    yield transport
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM tasklease_outbox")


def _producer(transport: MemoryTransport) -> Producer:
    return Producer("p", "l", worker_url=conftest.WORKER_URL, transport=transport)


def _deliver(queued: QueuedTask) -> str:
    """Deliver ``queued`` once as Cloud Tasks would; the worker's outcome."""
    client = Client()

    def post(path: str, headers: dict[str, str], data: bytes) -> Any:
        headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        response = client.post(path, data=data, content_type="application/json", headers=headers)
        answers.append(response.headers["X-Tasklease-Outcome"])
        return response

    answers: list[str] = []
    MemoryTransport().deliver(queued, post, queued.request.queue_path.rsplit("/", 1)[-1])
    return answers[0]


def _children(queue: MemoryTransport) -> list[QueuedTask]:
    return [queued for queued in queue.tasks if RECORD.encode() in queued.request.body]


def _run_parent_twice(queue: MemoryTransport) -> None:
    [created] = queue.tasks
    assert _deliver(created) == "released"
    assert _deliver(created) == "processed"


def _run_children(queue: MemoryTransport) -> None:
    for child in _children(queue):
        assert _deliver(child) == "processed"


def test_a_parent_retried_after_its_enqueue_creates_its_child_once(
    queue: MemoryTransport,
) -> None:
    parent.enqueue("A-1")
    _run_parent_twice(queue)
    assert len(_children(queue)) == 1
    _run_children(queue)
    assert tasks.CALLS == ["receipt A-1"]
    first, retried = PARENT_RESULTS
    assert first == retried  # The retried parent got the same TaskResult id back.
    assert first in _children(queue)[0].request.body.decode()


def test_a_parent_retried_after_its_atomic_block_committed_creates_its_child_once(
    queue: MemoryTransport,
) -> None:
    parent_result = atomic_parent.enqueue("A-2")
    _run_parent_twice(queue)
    db = open_outbox(conftest.OUTBOX_URL)
    try:
        relayed = Relay(db, _producer(queue)).drain()
    finally:
        db.close()
    assert relayed.sent == 1  # The retry's entry names the task the first one staged.
    assert len(_children(queue)) == 1
    _run_children(queue)
    assert tasks.CALLS == ["receipt A-2"]
    assert PARENT_RESULTS[0] == PARENT_RESULTS[1] != parent_result.id


def test_an_async_parent_retried_after_its_enqueue_creates_its_child_once(
    queue: MemoryTransport,
) -> None:
    async_parent.enqueue("A-3")
    _run_parent_twice(queue)
    assert len(_children(queue)) == 1
    assert PARENT_RESULTS[0] == PARENT_RESULTS[1]


def test_a_plain_handler_retried_after_its_enqueues_creates_each_child_once(
    queue: MemoryTransport,
) -> None:
    _producer(queue).enqueue("ship", "A-4", key="A-4")
    with override_settings(TASKLEASE_ROUTER=f"{__name__}:ROUTER"):
        _run_parent_twice(queue)
        assert len(_children(queue)) == 3
        _run_children(queue)
    assert sorted(tasks.CALLS) == ["invoice A-4", "invoice copy A-4", "label A-4"]
    first_invoice, first_copy, invoice, copy = PARENT_RESULTS
    assert (first_invoice, first_copy) == (invoice, copy)
    assert invoice != copy  # Two enqueues of one task in a run: two tasks.


def test_outside_a_handler_each_enqueue_call_is_a_new_task(queue: MemoryTransport) -> None:
    first = tasks.record.enqueue("twice")
    second = tasks.record.enqueue("twice")
    assert first.id != second.id
    assert len(_children(queue)) == 2
    _run_children(queue)
    assert tasks.CALLS == ["twice", "twice"]
