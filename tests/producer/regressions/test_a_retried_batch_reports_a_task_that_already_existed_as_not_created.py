"""Finding: an ``enqueue_many`` batch whose BatchCreateTasks answer was lost, and which the
producer therefore sent again with the same ``request_id``, reported a task that had existed
before the call as ``created=True``. Cloud Tasks answers a repeated ``request_id`` with the
first operation, the only execution of the batch: a task it reports as already existing was
there before the batch, so it is ``created=False`` whatever the attempt count. (A retried
single CreateTask is another matter: its ALREADY_EXISTS may be its own lost first attempt.)
Run against the tasklease emulator, which replays a ``request_id`` as Cloud Tasks does, and
the in-process memory transport, which now does too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tasklease.emulator import CloudTasksEmulator
from tasklease.producer import (
    BatchOutcome,
    CloudTasksTransport,
    Producer,
    RetryPolicy,
    TaskRequest,
    TransientEnqueueError,
)
from tasklease.producer.memory import MemoryTransport

QUEUE = "projects/p/locations/us-central1/queues/q"


class FirstBatchAnswerLost(CloudTasksTransport):
    """Its first BatchCreateTasks reaches the emulator and runs, then its answer is lost."""

    def __init__(self, client: Any) -> None:
        super().__init__(client=client)
        self.request_ids: list[str] = []

    def create_tasks(
        self, tasks: Sequence[TaskRequest], request_id: str, timeout: float
    ) -> BatchOutcome:
        self.request_ids.append(request_id)
        outcome = super().create_tasks(tasks, request_id, timeout)
        if len(self.request_ids) == 1:
            raise TransientEnqueueError("injected: the batch ran, its answer was lost")
        return outcome


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_a_task_that_existed_before_a_retried_batch_is_reported_not_created(
    emulator: CloudTasksEmulator, protocol: str
) -> None:
    emulator.create_queue(QUEUE)
    emulator.client().pause_queue(name=QUEUE)  # Nothing is dispatched: only creates count.
    transport = FirstBatchAnswerLost(emulator.client(protocol))
    producer = Producer(
        "p",
        "us-central1",
        "q",
        "http://127.0.0.1:9",
        transport=transport,
        retry=RetryPolicy(max_attempts=3, initial=0.001, maximum=0.002),
    )
    before = producer.enqueue("t", {}, key="taken")
    assert before.created

    results = producer.enqueue_many("t", [("taken", {}), ("new-1", {}), ("new-2", {})])

    assert len(transport.request_ids) == 2
    assert transport.request_ids[0] == transport.request_ids[1]  # The same operation, replayed.
    assert [(r.key, r.created, r.attempts, r.ok) for r in results] == [
        ("taken", False, 2, True),
        ("new-1", True, 2, True),
        ("new-2", True, 2, True),
    ]
    assert len(list(emulator.client().list_tasks(parent=QUEUE))) == 3


class MemoryBatchAnswerLost(MemoryTransport):
    """The in-process transport, its first batch's answer lost after the batch ran."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def create_tasks(
        self, tasks: Sequence[TaskRequest], request_id: str, timeout: float
    ) -> BatchOutcome:
        self.batches += 1
        outcome = super().create_tasks(tasks, request_id, timeout)
        if self.batches == 1:
            raise TransientEnqueueError("injected: the batch ran, its answer was lost")
        return outcome


def test_the_memory_transport_replays_a_retried_batch_as_cloud_tasks_does() -> None:
    transport = MemoryBatchAnswerLost()
    producer = Producer(
        "p",
        "us-central1",
        "q",
        "http://127.0.0.1:9",
        transport=transport,
        retry=RetryPolicy(max_attempts=3, initial=0.001, maximum=0.002),
    )
    producer.enqueue("t", {}, key="taken")
    results = producer.enqueue_many("t", [("taken", {}), ("new", {})])
    assert [(r.key, r.created, r.attempts) for r in results] == [
        ("taken", False, 2),
        ("new", True, 2),
    ]
    assert transport.batches == 2 and len(transport.tasks) == 2
