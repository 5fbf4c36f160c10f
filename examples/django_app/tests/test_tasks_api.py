"""What Django's Tasks API does on this backend, the same on Django 6 (``django.tasks``) and
on the backport: ``enqueue`` outside a transaction creates the Cloud Task at once,
``aenqueue`` from async code, ``run_after`` is the task's schedule time; a ``priority`` and
``get_result`` are refused (Cloud Tasks has no priorities; results live in the worker's store)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.utils import timezone
from shop import tasks
from shop.models import Order

from tasklease.django import compat
from tasklease.testing.stubs import StubQueue
from tests.conftest import Worker


def test_a_task_enqueued_outside_a_transaction_is_created_at_once_and_runs_once(
    queue: StubQueue,
) -> None:
    order = Order.objects.create(total=5)
    result = tasks.send_receipt.enqueue(order.pk)
    assert result.status == compat.TaskResultStatus.READY and not result.is_finished
    [created] = queue.tasks
    assert created.handler == "django_task" and created.payload["id"] == result.id
    summary = queue.drain(Worker(), duplicate_every=1)
    assert tasks.sent == [order.pk]
    assert summary.executions("django_task") == 1


def test_aenqueue_from_async_code_creates_the_task(queue: StubQueue) -> None:
    order = Order.objects.create(total=7)
    result = asyncio.run(tasks.send_receipt.aenqueue(order.pk))
    assert [t.payload["id"] for t in queue.tasks] == [result.id]
    queue.drain(Worker())
    assert tasks.sent == [order.pk]


def test_run_after_is_the_cloud_tasks_schedule_time(queue: StubQueue) -> None:
    when = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    tasks.send_receipt.using(run_after=when).enqueue(1)
    [created] = queue.tasks
    assert created.schedule_time == when


def test_a_priority_is_refused_as_cloud_tasks_has_none() -> None:
    with pytest.raises(compat.InvalidTask, match="priority"):
        tasks.send_receipt.using(priority=10)


def test_results_are_the_workers_run_records_not_djangos(queue: StubQueue) -> None:
    result = tasks.send_receipt.enqueue(1)
    with pytest.raises(NotImplementedError, match="tasklease runs"):
        tasks.send_receipt.get_result(result.id)
