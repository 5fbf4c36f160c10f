"""The emulator's API through the real google-cloud-tasks client, over both of its transports:
REST and gRPC (the client's default)."""

from __future__ import annotations

import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from google.api_core import exceptions as api
from google.cloud import tasks_v2
from google.protobuf import duration_pb2, field_mask_pb2, timestamp_pb2

from tasklease.emulator import CloudTasksEmulator
from tasklease.producer import PermanentEnqueueError, Producer
from tests.support.emulator_target import Target

PARENT = "projects/p/locations/us-central1"
QUEUE = f"{PARENT}/queues/q"


def two_free_ports() -> int:
    """A port that is free, and whose successor is free too."""
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port: int = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two consecutive free ports")


def http_task(url: str, task_id: str | None = None, **fields: object) -> tasks_v2.Task:
    task = tasks_v2.Task(http_request=tasks_v2.HttpRequest(url=url, body=b'{"a": 1}'), **fields)
    if task_id:
        task.name = f"{QUEUE}/tasks/{task_id}"
    return task


@pytest.fixture(params=["rest", "grpc"])
def client(
    emulator: CloudTasksEmulator, request: pytest.FixtureRequest
) -> tasks_v2.CloudTasksClient:
    client: tasks_v2.CloudTasksClient = emulator.client(request.param)
    client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    return client


def test_queue_is_created_with_the_documented_defaults(client: tasks_v2.CloudTasksClient) -> None:
    queue = client.get_queue(name=QUEUE)
    assert queue.state == tasks_v2.Queue.State.RUNNING
    assert queue.rate_limits.max_dispatches_per_second == 500
    assert queue.rate_limits.max_concurrent_dispatches == 1000
    assert queue.retry_config.max_attempts == 100
    assert queue.retry_config.min_backoff == timedelta(seconds=0.1)
    assert queue.retry_config.max_backoff == timedelta(seconds=3600)
    assert queue.retry_config.max_doublings == 16
    assert [q.name for q in client.list_queues(parent=PARENT)] == [QUEUE]


def test_queue_errors_use_googles_error_shape(client: tasks_v2.CloudTasksClient) -> None:
    # AlreadyExists over gRPC (a Conflict subclass), Conflict over REST, as from Google.
    with pytest.raises(api.Conflict, match="already exists"):
        client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    with pytest.raises(api.NotFound, match="not found"):
        client.get_queue(name=f"{PARENT}/queues/missing")
    with pytest.raises(api.BadRequest, match="maxDispatchesPerSecond"):
        client.create_queue(
            parent=PARENT,
            queue=tasks_v2.Queue(
                name=f"{PARENT}/queues/fast",
                rate_limits=tasks_v2.RateLimits(max_dispatches_per_second=501),
            ),
        )


def test_update_queue_changes_only_the_masked_fields(client: tasks_v2.CloudTasksClient) -> None:
    update = tasks_v2.Queue(
        name=QUEUE,
        retry_config=tasks_v2.RetryConfig(
            max_attempts=5, min_backoff=duration_pb2.Duration(seconds=2)
        ),
        rate_limits=tasks_v2.RateLimits(max_dispatches_per_second=7),
    )
    mask = field_mask_pb2.FieldMask(
        paths=["retry_config.max_attempts", "rate_limits.max_dispatches_per_second"]
    )
    queue = client.update_queue(queue=update, update_mask=mask)
    assert queue.retry_config.max_attempts == 5
    assert queue.retry_config.min_backoff == timedelta(seconds=0.1)  # Not in the mask.
    assert queue.rate_limits.max_dispatches_per_second == 7
    assert client.get_queue(name=QUEUE).retry_config.max_attempts == 5


def test_pause_resume_purge_and_delete(
    client: tasks_v2.CloudTasksClient, target: tuple[Target, str]
) -> None:
    recorder, url = target
    assert client.pause_queue(name=QUEUE).state == tasks_v2.Queue.State.PAUSED
    client.create_task(parent=QUEUE, task=http_task(url, "paused-1"))
    time.sleep(0.3)
    assert recorder.hits == []
    assert len(list(client.list_tasks(parent=QUEUE))) == 1
    client.purge_queue(name=QUEUE)
    assert list(client.list_tasks(parent=QUEUE)) == []
    with pytest.raises(api.Conflict):  # Purged names stay taken.
        client.create_task(parent=QUEUE, task=http_task(url, "paused-1"))
    assert client.resume_queue(name=QUEUE).state == tasks_v2.Queue.State.RUNNING
    client.delete_queue(name=QUEUE)
    with pytest.raises(api.NotFound):
        client.get_queue(name=QUEUE)


def test_task_get_list_delete_and_views(
    client: tasks_v2.CloudTasksClient, target: tuple[Target, str]
) -> None:
    _, url = target
    client.pause_queue(name=QUEUE)
    later = timestamp_pb2.Timestamp()
    later.FromDatetime(datetime.now(UTC) + timedelta(hours=1))
    created = client.create_task(
        parent=QUEUE,
        task=http_task(
            url, "t1", schedule_time=later, dispatch_deadline=duration_pb2.Duration(seconds=60)
        ),
    )
    assert created.name == f"{QUEUE}/tasks/t1"
    assert created.http_request.body == b""  # BASIC view leaves the body out.
    full = client.get_task(request={"name": created.name, "response_view": tasks_v2.Task.View.FULL})
    assert full.http_request.body == b'{"a": 1}'
    assert full.dispatch_deadline == timedelta(seconds=60)
    assert full.schedule_time.timestamp() == pytest.approx(later.ToDatetime().timestamp(), abs=1e-3)
    for n in range(3):
        client.create_task(parent=QUEUE, task=http_task(url, f"more-{n}"))
    assert len(list(client.list_tasks(request={"parent": QUEUE, "page_size": 2}))) == 4
    client.delete_task(name=created.name)
    with pytest.raises(api.NotFound):
        client.get_task(name=created.name)
    with pytest.raises(api.Conflict):  # Deleted names stay taken.
        client.create_task(parent=QUEUE, task=http_task(url, "t1"))


def test_unnamed_tasks_get_generated_names(
    client: tasks_v2.CloudTasksClient, target: tuple[Target, str]
) -> None:
    client.pause_queue(name=QUEUE)
    names = {client.create_task(parent=QUEUE, task=http_task(target[1])).name for _ in range(5)}
    assert len(names) == 5
    assert all(name.startswith(f"{QUEUE}/tasks/") for name in names)


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (
            tasks_v2.Task(
                name=f"{QUEUE}/tasks/bad.name", http_request=tasks_v2.HttpRequest(url="http://x/")
            ),
            "invalid task name",
        ),
        (
            tasks_v2.Task(
                name=f"{PARENT}/queues/other/tasks/t",
                http_request=tasks_v2.HttpRequest(url="http://x/"),
            ),
            "invalid task name",
        ),
        (
            tasks_v2.Task(
                http_request=tasks_v2.HttpRequest(url="http://x/", body=b"x" * 1024 * 1024)
            ),
            "maximum task size",
        ),
        (tasks_v2.Task(http_request=tasks_v2.HttpRequest(url="ftp://x/")), "must be http"),
        (
            tasks_v2.Task(
                http_request=tasks_v2.HttpRequest(url="http://x/"),
                dispatch_deadline=duration_pb2.Duration(seconds=5),
            ),
            "dispatchDeadline",
        ),
    ],
)
def test_invalid_tasks_are_refused_with_invalid_argument(
    client: tasks_v2.CloudTasksClient, task: tasks_v2.Task, message: str
) -> None:
    with pytest.raises(api.BadRequest, match=message):
        client.create_task(parent=QUEUE, task=task)


def test_schedule_time_over_thirty_days_ahead_is_refused(client: tasks_v2.CloudTasksClient) -> None:
    far = timestamp_pb2.Timestamp()
    far.FromDatetime(datetime.now(UTC) + timedelta(days=31))
    with pytest.raises(api.BadRequest, match="30 days"):
        client.create_task(parent=QUEUE, task=http_task("http://x/", schedule_time=far))


def test_tombstones_expire_after_the_dedup_window(target: tuple[Target, str]) -> None:
    with CloudTasksEmulator(dedup_window=3.0) as emulator:
        emulator.create_queue(QUEUE)
        client = emulator.client()
        client.create_task(parent=QUEUE, task=http_task(target[1], "again"))
        emulator.join()
        with pytest.raises(api.Conflict):
            client.create_task(parent=QUEUE, task=http_task(target[1], "again"))
        time.sleep(3.1)
        client.create_task(parent=QUEUE, task=http_task(target[1], "again"))
        emulator.join()
    assert len(target[0].hits) == 2


def test_state_survives_a_restart(tmp_path: Path, target: tuple[Target, str]) -> None:
    recorder, url = target
    with CloudTasksEmulator(data_dir=tmp_path) as emulator:
        emulator.create_queue(QUEUE)
        client = emulator.client()
        client.create_task(parent=QUEUE, task=http_task(url, "done"))
        emulator.join()
        client.pause_queue(name=QUEUE)
        client.create_task(parent=QUEUE, task=http_task(url, "pending"))
    with CloudTasksEmulator(data_dir=tmp_path) as emulator:
        client = emulator.client()
        assert [t.name.rsplit("/", 1)[1] for t in client.list_tasks(parent=QUEUE)] == ["pending"]
        with pytest.raises(api.Conflict):
            client.create_task(parent=QUEUE, task=http_task(url, "done"))
        client.resume_queue(name=QUEUE)
        emulator.join()
    assert [hit.headers["X-Cloudtasks-Taskname"] for hit in recorder.hits] == ["done", "pending"]


def test_run_task_dispatches_now_even_when_paused(
    client: tasks_v2.CloudTasksClient, emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    client.pause_queue(name=QUEUE)
    task = client.create_task(parent=QUEUE, task=http_task(target[1], "manual"))
    client.run_task(name=task.name)
    emulator.join(QUEUE)
    assert len(target[0].hits) == 1


def test_the_producer_reaches_the_emulator_unchanged(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    emulator.create_queue(QUEUE)
    base = target[1].rsplit("/tasks/", 1)[0]
    producer = Producer("p", "us-central1", "q", base, tasks_endpoint=emulator.url)
    assert producer.enqueue("hit", {"n": 1}, key="k").created
    assert not producer.enqueue("hit", {"n": 1}, key="k").created
    emulator.join()
    assert not producer.enqueue("hit", {"n": 1}, key="k").created  # Executed: still taken.
    with pytest.raises(PermanentEnqueueError, match="not found"):
        Producer("p", "us-central1", "missing", base, tasks_endpoint=emulator.url).enqueue(
            "hit", {}
        )
    assert len(target[0].hits) == 1


def test_malformed_page_tokens_are_invalid_argument(emulator: CloudTasksEmulator) -> None:
    emulator.create_queue(QUEUE)
    response = requests.get(
        f"{emulator.url}/v2/{QUEUE}/tasks", params={"pageToken": "x"}, timeout=5
    )
    assert response.status_code == 400
    assert response.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_duplicate_names_raise_already_exists_over_grpc(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    client = emulator.client("grpc")
    client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    client.pause_queue(name=QUEUE)
    client.create_task(parent=QUEUE, task=http_task(target[1], "once"))
    with pytest.raises(api.AlreadyExists, match="Requested entity already exists"):
        client.create_task(parent=QUEUE, task=http_task(target[1], "once"))
    with pytest.raises(api.AlreadyExists):
        client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))


def test_rest_and_grpc_share_one_database(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    rest, grpc = emulator.client("rest"), emulator.client("grpc")
    rest.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    grpc.pause_queue(name=QUEUE)
    grpc.create_task(parent=QUEUE, task=http_task(target[1], "shared"))
    assert rest.get_queue(name=QUEUE).state == tasks_v2.Queue.State.PAUSED
    assert [t.name for t in rest.list_tasks(parent=QUEUE)] == [f"{QUEUE}/tasks/shared"]
    with pytest.raises(api.Conflict):
        rest.create_task(parent=QUEUE, task=http_task(target[1], "shared"))
    rest.resume_queue(name=QUEUE)
    emulator.join()
    assert len(target[0].hits) == 1


def test_grpc_listens_on_the_rest_port_plus_one_on_loopback(tmp_path: Path) -> None:
    port = two_free_ports()
    with CloudTasksEmulator(data_dir=tmp_path, port=port) as emulator:
        assert emulator.grpc_target == f"127.0.0.1:{port + 1}"
        client = emulator.client("grpc")
        client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
        assert [q.name for q in client.list_queues(parent=PARENT)] == [QUEUE]
