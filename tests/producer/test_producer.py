"""The producer through the real google-cloud-tasks client, against local endpoints."""

from __future__ import annotations

import base64
import json
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tasklease.producer import (
    EnqueueResult,
    FanOutIncomplete,
    InvalidTask,
    MemoryTransport,
    PermanentEnqueueError,
    Producer,
    RetryPolicy,
    TaskRequest,
    TransientEnqueueError,
    task_id,
)
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores import MemoryStore
from tests.support.fake_cloud_tasks import FakeCloudTasks
from tests.support.helpers import job_headers

WORKER = "https://worker-xyz.a.run.app"
SA = "tasks@p.iam.gserviceaccount.com"


def make_producer(fake: FakeCloudTasks, **overrides: Any) -> Producer:
    settings: dict[str, Any] = {
        "project": "p",
        "location": "us-central1",
        "queue": "default",
        "worker_url": WORKER,
        "service_account": SA,
        "tasks_endpoint": fake.endpoint,
        "retry": RetryPolicy(max_attempts=4, initial=0.001, maximum=0.002),
    }
    settings.update(overrides)
    return Producer(**settings)


def test_enqueue_sends_the_exact_create_task_request(cloud_tasks: FakeCloudTasks) -> None:
    producer = make_producer(cloud_tasks)
    at = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=500000)
    result = producer.enqueue(
        "send_receipt",
        {"order_id": 42},
        key="order-42",
        at=at,
        dispatch_deadline=timedelta(minutes=2),
    )
    expected_id = task_id("send_receipt", "order-42")
    queue = "projects/p/locations/us-central1/queues/default"
    assert result == EnqueueResult(f"{queue}/tasks/{expected_id}", expected_id, "order-42", True, 1)
    [sent] = cloud_tasks.requests
    assert sent["path"] == f"/v2/{queue}/tasks"
    task = sent["body"]["task"]
    assert task["name"] == f"{queue}/tasks/{expected_id}"
    http = task["httpRequest"]
    assert http["url"] == f"{WORKER}/tasks/send_receipt"
    assert http["httpMethod"] == 1  # HttpMethod.POST; the client asks for enum-encoding=int.
    assert json.loads(base64.b64decode(http["body"])) == {"order_id": 42}
    assert http["headers"] == {
        "Content-Type": "application/json",
        "X-Tasklease-Project": "p",
        "X-Tasklease-Location": "us-central1",
    }
    assert http["oidcToken"] == {"serviceAccountEmail": SA, "audience": WORKER}
    assert task["dispatchDeadline"] == "120s"
    assert task["scheduleTime"] == at.strftime("%Y-%m-%dT%H:%M:%S.500Z")
    producer.close()


def test_delay_becomes_a_schedule_time(cloud_tasks: FakeCloudTasks) -> None:
    before = datetime.now(UTC)
    make_producer(cloud_tasks).enqueue("t", {}, key="k", delay=timedelta(seconds=30))
    stamp = cloud_tasks.requests[0]["body"]["task"]["scheduleTime"]
    scheduled = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert timedelta(seconds=29) < scheduled - before < timedelta(seconds=40)


def test_same_key_twice_is_a_duplicate_not_an_error(cloud_tasks: FakeCloudTasks) -> None:
    producer = make_producer(cloud_tasks)
    first = producer.enqueue("send_receipt", {"order_id": 42}, key="order-42")
    second = producer.enqueue("send_receipt", {"order_id": 42}, key="order-42")
    assert (first.created, second.created) == (True, False)
    assert first.name == second.name
    assert len(cloud_tasks.tasks) == 1


def test_without_a_key_every_enqueue_is_a_new_named_task(cloud_tasks: FakeCloudTasks) -> None:
    producer = make_producer(cloud_tasks)
    names = {producer.enqueue("ping", None).name for _ in range(3)}
    assert len(names) == 3
    assert all("/tasks/" in name for name in names)


@pytest.mark.parametrize(
    ("status", "grpc_status"),
    [
        (503, "UNAVAILABLE"),
        (504, "DEADLINE_EXCEEDED"),
        (429, "RESOURCE_EXHAUSTED"),
        (500, "INTERNAL"),
        (409, "ABORTED"),
    ],
)
def test_transient_errors_are_retried_then_succeed(
    cloud_tasks: FakeCloudTasks, status: int, grpc_status: str
) -> None:
    cloud_tasks.fail_next(status, grpc_status)
    cloud_tasks.fail_next(status, grpc_status)
    result = make_producer(cloud_tasks).enqueue("t", {}, key="k")
    assert (result.created, result.attempts) == (True, 3)
    assert len(cloud_tasks.tasks) == 1


def test_already_exists_after_our_own_lost_create_counts_as_created(
    cloud_tasks: FakeCloudTasks,
) -> None:
    cloud_tasks.fail_next(503, "UNAVAILABLE", create_anyway=True)  # Created, answer lost.
    result = make_producer(cloud_tasks).enqueue("t", {}, key="k")
    assert (result.created, result.attempts) == (True, 2)


def test_transient_errors_give_up_after_the_policy(cloud_tasks: FakeCloudTasks) -> None:
    for _ in range(4):
        cloud_tasks.fail_next(503, "UNAVAILABLE")
    with pytest.raises(TransientEnqueueError, match="after 4 attempts"):
        make_producer(cloud_tasks).enqueue("t", {}, key="k")


@pytest.mark.parametrize(
    ("status", "grpc_status", "message"),
    [
        (404, "NOT_FOUND", "queue projects/p/locations/us-central1/queues/default not found"),
        (403, "PERMISSION_DENIED", "roles/cloudtasks.enqueuer"),
        (400, "INVALID_ARGUMENT", "refused the task"),
    ],
)
def test_permanent_errors_raise_at_once_saying_what_to_fix(
    cloud_tasks: FakeCloudTasks, status: int, grpc_status: str, message: str
) -> None:
    cloud_tasks.fail_next(status, grpc_status)
    with pytest.raises(PermanentEnqueueError, match=message):
        make_producer(cloud_tasks).enqueue("t", {}, key="k")
    assert len(cloud_tasks.requests) == 1


def test_unreachable_endpoint_is_transient_and_gives_up() -> None:
    producer = Producer(
        "p",
        "l",
        "q",
        WORKER,
        tasks_endpoint="http://127.0.0.1:9",
        retry=RetryPolicy(max_attempts=2, initial=0.001, maximum=0.001),
    )
    with pytest.raises(TransientEnqueueError, match="ConnectionError"):
        producer.enqueue("t", {}, key="k")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: p.enqueue("t", {1, 2}), "not JSON-serialisable"),
        (lambda p: p.enqueue("t", float("nan")), "not JSON-serialisable"),
        (lambda p: p.enqueue("t", "x" * 1024 * 1024), "over Cloud Tasks' 1048576"),
        (lambda p: p.enqueue("t", {}, delay=timedelta(days=31)), "more than 30 days"),
        (lambda p: p.enqueue("t", {}, delay=timedelta(seconds=-1)), "negative"),
        (lambda p: p.enqueue("t", {}, at=datetime(2030, 1, 1)), "timezone-aware"),
        (
            lambda p: p.enqueue("t", {}, delay=timedelta(1), at=datetime.now(UTC)),
            "not both",
        ),
        (lambda p: p.enqueue("t", {}, key=""), "non-empty"),
        (lambda p: p.enqueue("t/../x", {}), "task_name"),
        (lambda p: p.enqueue("t", {}, dispatch_deadline=timedelta(hours=1)), "between 15 seconds"),
        (
            lambda p: p.enqueue("t", {}, headers={"X-CloudTasks-TaskName": "x"}),
            "set by Cloud Tasks",
        ),
        (lambda p: p.enqueue_many("t", [("a", {}), ("b", {1})]), "not JSON-serialisable"),
    ],
)
def test_bad_input_is_refused_before_any_network_call(
    cloud_tasks: FakeCloudTasks, call: Any, message: str
) -> None:
    with pytest.raises(InvalidTask, match=message):
        call(make_producer(cloud_tasks))
    assert cloud_tasks.requests == []


def test_unknown_option_is_refused(cloud_tasks: FakeCloudTasks) -> None:
    with pytest.raises(TypeError, match="priority"):
        make_producer(cloud_tasks).enqueue("t", {}, priority=1)  # type: ignore[call-arg]
    assert cloud_tasks.requests == []


def test_enqueue_many_returns_one_result_per_item_in_order(cloud_tasks: FakeCloudTasks) -> None:
    producer = make_producer(cloud_tasks)
    producer.enqueue("report", {"n": 3}, key="k3")
    items = [(f"k{n}", {"n": n}) for n in range(10)]
    results = producer.enqueue_many("report", items, concurrency=4)
    assert [r.key for r in results] == [f"k{n}" for n in range(10)]
    assert [r.created for r in results] == [n != 3 for n in range(10)]
    assert len(cloud_tasks.tasks) == 10


def test_enqueue_many_reports_a_failed_item_and_a_rerun_completes_it(
    cloud_tasks: FakeCloudTasks,
) -> None:
    producer = make_producer(cloud_tasks, retry=RetryPolicy(max_attempts=1), batch=False)
    cloud_tasks.fail_next(503, "UNAVAILABLE")
    items = [(f"k{n}", {"n": n}) for n in range(5)]
    first = producer.enqueue_many("report", items, concurrency=1)
    assert [r.ok for r in first] == [False, True, True, True, True]
    assert isinstance(first[0].error, TransientEnqueueError)
    second = producer.enqueue_many("report", items, concurrency=1)
    assert all(r.ok for r in second)
    assert [r.created for r in second] == [True, False, False, False, False]
    assert len(cloud_tasks.tasks) == 5


def test_a_batch_that_kept_failing_fails_its_items_and_a_rerun_completes_them(
    cloud_tasks: FakeCloudTasks,
) -> None:
    producer = make_producer(cloud_tasks, retry=RetryPolicy(max_attempts=1))
    cloud_tasks.fail_next(503, "UNAVAILABLE")
    items = [(f"k{n}", {"n": n}) for n in range(5)]
    first = producer.enqueue_many("report", items)
    assert not any(r.ok for r in first)
    assert isinstance(first[0].error, TransientEnqueueError)
    assert "batch of 5 tasks" in str(first[0].error)
    second = producer.enqueue_many("report", items)
    assert [r.created for r in second] == [True] * 5
    assert (cloud_tasks.batches, cloud_tasks.requests) == (2, [])


def test_a_lost_batch_answer_is_retried_and_settled_by_the_first_operation(
    cloud_tasks: FakeCloudTasks,
) -> None:
    producer = make_producer(cloud_tasks)
    producer.enqueue("report", {"n": 0}, key="k0")
    cloud_tasks.fail_next(503, "UNAVAILABLE", create_anyway=True)
    results = producer.enqueue_many("report", [(f"k{n}", {"n": n}) for n in range(4)])
    # The retry gets the first operation's answer: k0 was there before it, the rest it made.
    assert [(r.created, r.attempts) for r in results] == [(False, 2)] + [(True, 2)] * 3
    assert cloud_tasks.batches == 2 and len(cloud_tasks.tasks) == 4


def test_enqueue_many_sends_batches_of_at_most_100_per_queue(cloud_tasks: FakeCloudTasks) -> None:
    producer = make_producer(cloud_tasks)
    items = [(f"k{n}", {"n": n}) for n in range(250)]
    results = producer.enqueue_many("report", items)
    other = producer.enqueue_many("report", items[:3], queue="other")
    assert all(r.created for r in results + other)
    assert cloud_tasks.batches == 4 and cloud_tasks.requests == []
    assert sum("/queues/other/" in name for name in cloud_tasks.tasks) == 3


def test_a_key_given_twice_in_one_call_is_created_once(cloud_tasks: FakeCloudTasks) -> None:
    producer = make_producer(cloud_tasks)
    results = producer.enqueue_many("report", [("a", {}), ("b", {}), ("a", {})])
    assert [r.created for r in results] == [True, True, False]
    assert len(cloud_tasks.tasks) == 2


def test_batch_false_creates_each_task_on_its_own(cloud_tasks: FakeCloudTasks) -> None:
    producer = make_producer(cloud_tasks, batch=False)
    assert all(r.created for r in producer.enqueue_many("report", [("a", {}), ("b", {})]))
    assert (cloud_tasks.batches, len(cloud_tasks.requests)) == (0, 2)
    env_producer = Producer.from_env(
        {
            "TASKLEASE_PROJECT": "p",
            "TASKLEASE_LOCATION": "l",
            "TASKLEASE_WORKER_URL": WORKER,
            "TASKLEASE_BATCH": "0",
        }
    )
    assert not env_producer.batch


class Run:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id


def test_fan_out_of_a_redelivered_run_creates_each_task_once(cloud_tasks: FakeCloudTasks) -> None:
    producer = make_producer(cloud_tasks)
    items = [(f"customer-{n}", {"customer": n}) for n in range(1000)]
    first = producer.fan_out(Run("a" * 64), "send_report", items, concurrency=32)
    again = producer.fan_out(Run("a" * 64), "send_report", items, concurrency=32)
    assert sum(r.created for r in first) == 1000
    assert sum(r.created for r in again) == 0
    assert len(cloud_tasks.tasks) == 1000
    next_run = producer.fan_out(Run("b" * 64), "send_report", items[:10])
    assert all(r.created for r in next_run)


def test_from_env_reads_the_documented_variables(cloud_tasks: FakeCloudTasks) -> None:
    env = {
        "GOOGLE_CLOUD_PROJECT": "proj",
        "TASKLEASE_LOCATION": "europe-west1",
        "TASKLEASE_QUEUE": "emails",
        "TASKLEASE_WORKER_URL": "http://127.0.0.1:8080",
        "TASKLEASE_SERVICE_ACCOUNT": SA,
        "TASKLEASE_TASKS_ENDPOINT": cloud_tasks.endpoint,
        "TASKLEASE_DISPATCH_DEADLINE": "900",
    }
    producer = Producer.from_env(env)
    result = producer.enqueue("t", {}, key="k")
    assert cloud_tasks.requests[0]["body"]["task"]["dispatchDeadline"] == "900s"
    assert result.name.startswith("projects/proj/locations/europe-west1/queues/emails/tasks/")
    oidc = cloud_tasks.requests[0]["body"]["task"]["httpRequest"]["oidcToken"]
    assert oidc["audience"] == "http://127.0.0.1:8080"


def test_from_env_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match="TASKLEASE_LOCATION, TASKLEASE_WORKER_URL"):
        Producer.from_env({"TASKLEASE_PROJECT": "p"})


def test_memory_transport_has_the_same_naming_semantics() -> None:
    memory = MemoryTransport()
    producer = Producer("p", "l", "q", WORKER, transport=memory)
    assert producer.enqueue("t", {"a": 1}, key="k").created
    assert not producer.enqueue("t", {"a": 1}, key="k").created
    assert [t.request.task_id for t in memory.tasks] == [task_id("t", "k")]


# Python 3.12+ warns about forking a threaded process; forking is the very case tested here.
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_each_process_gets_its_own_client_after_a_fork(cloud_tasks: FakeCloudTasks) -> None:
    producer = make_producer(cloud_tasks)
    parent_client = producer.transport.client  # type: ignore[attr-defined]
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # In the child: a new client, and it works.
        try:
            fresh = producer.transport.client is not parent_client  # type: ignore[attr-defined]
            created = producer.enqueue("t", {}, key="from-child").created
            os.write(writer, b"ok" if fresh and created else b"no")
        finally:
            os._exit(0)
    os.close(writer)
    os.waitpid(child, 0)
    assert os.read(reader, 2) == b"ok"
    assert producer.transport.client is parent_client  # type: ignore[attr-defined]


def test_memory_transport_delivers_to_a_worker_in_the_users_own_tests() -> None:
    router = Router()
    sent: list[int] = []

    @router.task("send_receipt")
    def send_receipt(payload: Any, ctx: TaskContext) -> None:
        sent.append(payload["order_id"])

    client = create_app(router, store="memory://", auth="none").test_client()
    queue = MemoryTransport()
    producer = Producer("p", "l", "q", "https://worker.example", transport=queue)
    producer.enqueue("send_receipt", {"order_id": 42}, key="order-42")
    [task] = queue.pending()
    assert queue.deliver(task, client.post, "q") == 200
    assert queue.deliver(task, client.post, "q") == 200  # A duplicate delivery: absorbed.
    assert queue.pending() == []
    assert sent == [42]
    assert task.deliveries == 2


class _FlakyTransport(MemoryTransport):
    """Refuses the creates whose task ids are in ``failing`` (a permanent error)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: set[str] = set()

    def create_task(self, task: TaskRequest, timeout: float) -> None:
        if task.task_id in self.failing:
            raise PermanentEnqueueError(f"refused {task.task_id}")
        super().create_task(task, timeout)


def test_fan_out_that_loses_children_raises_and_its_retry_creates_only_those() -> None:
    transport = _FlakyTransport()
    producer = Producer("p", "l", "q", "http://127.0.0.1:1", transport=transport)
    run = Run("c" * 64)
    items = [(f"customer-{n}", {"customer": n}) for n in range(10)]
    transport.failing = {task_id("send_report", f"{run.run_id}/customer-3")}
    transport.failing.add(task_id("send_report", f"{run.run_id}/customer-7"))
    with pytest.raises(FanOutIncomplete) as raised:
        producer.fan_out(run, "send_report", items)
    assert raised.value.failed_keys == ["customer-3", "customer-7"]
    assert "customer-3, customer-7" in str(raised.value)
    assert sum(r.created for r in raised.value.results) == 8  # Every other child was tried.
    transport.failing = set()
    retry = producer.fan_out(run, "send_report", items)
    created = [item for (item, _), result in zip(items, retry, strict=True) if result.created]
    assert created == ["customer-3", "customer-7"]
    assert len(transport.tasks) == 10


def test_a_scheduled_run_whose_fan_out_failed_is_released_and_completed_by_its_retry() -> None:
    transport = _FlakyTransport()
    producer = Producer("p", "l", "q", "http://127.0.0.1:1", transport=transport)
    router = Router()

    @router.scheduled("nightly")
    def nightly(ctx: TaskContext) -> int:
        return len(producer.fan_out(ctx, "send_report", [(str(n), {"n": n}) for n in range(5)]))

    app = create_app(router, store=MemoryStore(), auth="none")
    original = transport.create_task
    calls = {"n": 0}

    def fail_third(task: TaskRequest, timeout: float) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise PermanentEnqueueError("queue refused one child")
        original(task, timeout)

    transport.create_task = fail_third  # type: ignore[method-assign]
    first = app.test_client().post("/jobs/nightly", headers=job_headers())
    assert (first.status_code, first.headers["X-Tasklease-Outcome"]) == (500, "released")
    retry = app.test_client().post("/jobs/nightly", headers=job_headers())
    assert retry.headers["X-Tasklease-Outcome"] == "processed"
    assert len(transport.tasks) == 5
