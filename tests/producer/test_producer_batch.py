"""Batch creates end to end against the tasklease emulator, over REST and gRPC."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tasklease.emulator import CloudTasksEmulator
from tasklease.producer import (
    BatchOutcome,
    CloudTasksTransport,
    FanOutIncomplete,
    PermanentEnqueueError,
    Producer,
    TaskRequest,
)

QUEUE = "projects/p/locations/us-central1/queues/q"


class CountingTransport(CloudTasksTransport):
    """Counts the calls; fails the batches whose number is in ``failing`` before sending."""

    def __init__(self, client: Any) -> None:
        super().__init__(client=client)
        self.calls = {"create_task": 0, "create_tasks": 0}
        self.failing: set[int] = set()

    def create_task(self, task: TaskRequest, timeout: float) -> None:
        self.calls["create_task"] += 1
        super().create_task(task, timeout)

    def create_tasks(
        self, tasks: Sequence[TaskRequest], request_id: str, timeout: float
    ) -> BatchOutcome:
        self.calls["create_tasks"] += 1
        if self.calls["create_tasks"] in self.failing:
            raise PermanentEnqueueError("injected: the batch was refused")
        return super().create_tasks(tasks, request_id, timeout)


class Run:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id


@pytest.fixture(params=["rest", "grpc"])
def transport(emulator: CloudTasksEmulator, request: pytest.FixtureRequest) -> CountingTransport:
    emulator.create_queue(QUEUE)
    emulator.client().pause_queue(name=QUEUE)  # Nothing is dispatched: only creates count.
    return CountingTransport(emulator.client(request.param))


def producer_for(transport: CountingTransport) -> Producer:
    return Producer("p", "us-central1", "q", "http://127.0.0.1:9", transport=transport)


def listed(emulator: CloudTasksEmulator) -> int:
    return len(list(emulator.client().list_tasks(parent=QUEUE)))


def test_a_fan_out_creates_its_children_in_batches_of_100(
    emulator: CloudTasksEmulator, transport: CountingTransport
) -> None:
    producer = producer_for(transport)
    items = [(f"customer-{n}", {"customer": n}) for n in range(250)]
    first = producer.fan_out(Run("a" * 64), "send_report", items)
    again = producer.fan_out(Run("a" * 64), "send_report", items)
    assert sum(r.created for r in first) == 250
    assert sum(r.created for r in again) == 0 and all(r.ok for r in again)
    assert transport.calls == {"create_task": 0, "create_tasks": 6}
    assert listed(emulator) == 250


def test_a_fan_out_missing_a_batch_names_its_children_and_the_retry_creates_only_those(
    emulator: CloudTasksEmulator, transport: CountingTransport
) -> None:
    producer = producer_for(transport)
    run = Run("b" * 64)
    items = [(f"customer-{n}", {"customer": n}) for n in range(250)]
    transport.failing = {2}
    with pytest.raises(FanOutIncomplete) as raised:
        producer.fan_out(run, "send_report", items, concurrency=1)  # Batches go out in order.
    assert raised.value.failed_keys == [f"customer-{n}" for n in range(100, 200)]
    assert listed(emulator) == 150
    transport.failing = set()
    retry = producer.fan_out(run, "send_report", items)
    created = [key for (key, _), r in zip(items, retry, strict=True) if r.created]
    assert created == [f"customer-{n}" for n in range(100, 200)]
    assert listed(emulator) == 250


def test_enqueue_many_into_a_missing_queue_says_so_for_every_item(
    emulator: CloudTasksEmulator, transport: CountingTransport
) -> None:
    results = producer_for(transport).enqueue_many("t", [("a", {}), ("b", {})], queue="nope")
    assert not any(r.ok for r in results)
    assert "queue projects/p/locations/us-central1/queues/nope not found" in str(results[0].error)
