"""Finding: gRPC ``CANCELLED`` from Cloud Tasks (a call cut off: a proxy, a deadline on the
way, the server shedding) was read as "the task is wrong": the producer gave up without
retrying, and the outbox relay marked the entry failed for good, so its task was never
created unless an operator requeued it. It is transient: the producer retries it, and the
relay backs the entry off and sends it again, in single creates and in a batch's per-task
answers alike."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from google.cloud import tasks_v2
from google.longrunning import operations_pb2  # type: ignore[import-untyped]
from google.protobuf import any_pb2
from google.rpc import status_pb2  # type: ignore[import-untyped]

from tasklease.outbox import Relay, open_outbox, relay_producer
from tasklease.producer import Producer, RetryPolicy, TaskRequest, task_id
from tasklease.producer.cloud_tasks_batch import outcome
from tests.support.fake_cloud_tasks import FakeCloudTasks
from tests.support.outbox import (
    LOCATION,
    PROJECT,
    QUEUE,
    QUEUE_PATH,
    WORKER,
    relay_env,
    sqlite_app_db,
)
from tests.support.outbox import producer as staging_producer

CANCELLED = 1  # google.rpc.Code.CANCELLED


def test_the_relay_backs_a_cancelled_entry_off_and_sends_it_again(
    tmp_path: Path, cloud_tasks: FakeCloudTasks
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("BEGIN")
    staging_producer(cloud_tasks.endpoint).enqueue("x", {}, key="k", transaction=conn)
    conn.commit()
    conn.close()
    for _ in range(10):  # More than the relay's producer tries: the round ends transient.
        cloud_tasks.fail_next(499, "CANCELLED")
    now = [time.time()]
    db = open_outbox(url)
    try:
        relay = Relay(db, relay_producer(relay_env(cloud_tasks.endpoint)), clock=lambda: now[0])
        first = relay.run_once()
        status = db.status(now[0])
        cloud_tasks.failures.clear()
        now[0] += 120  # Past the back-off.
        second = relay.run_once()
    finally:
        db.close()
    assert (first.failed, first.retrying) == (0, 1)
    assert (status.depth, status.retrying, status.failed_total) == (1, 1, 0)
    assert second.sent == 1
    assert any(name.endswith(task_id("x", "k")) for name in cloud_tasks.tasks)


def test_the_producer_retries_a_cancelled_create(cloud_tasks: FakeCloudTasks) -> None:
    cloud_tasks.fail_next(499, "CANCELLED")
    make = Producer(
        PROJECT,
        LOCATION,
        QUEUE,
        WORKER,
        tasks_endpoint=cloud_tasks.endpoint,
        retry=RetryPolicy(max_attempts=3, initial=0.0, maximum=0.0),
    )
    result = make.enqueue("x", {}, key="again")
    assert result.created and result.attempts == 2


def test_a_cancelled_task_in_a_batch_answer_is_uncertain_not_failed() -> None:
    """Uncertain tasks are created singly by the producer; failed ones are given up."""
    task = TaskRequest(QUEUE_PATH, "t", f"{WORKER}/tasks/x", b"{}")
    metadata = tasks_v2.BatchCreateTasksMetadata(
        failed_requests={0: status_pb2.Status(code=CANCELLED, message="cancelled")}
    )
    packed = any_pb2.Any(value=tasks_v2.BatchCreateTasksMetadata.serialize(metadata))
    operation = operations_pb2.Operation(name="op", done=True, metadata=packed)
    answer = outcome(operation, [task])
    assert task.name not in answer.failed
    assert task.name not in answer.created | answer.existed
