"""ListTasks pages 1000 tasks when no size is given and coerces a larger size to 1000, as the v2
docs say ("The maximum page size is 1000. If unspecified, the page size will be the maximum";
it paged 100); ListQueues' maximum is 9800. Times are truncated as Cloud Tasks documents:
``create_time`` to the second, ``dispatch_deadline`` to the millisecond, the queue's backoffs
to the millisecond and ``max_retry_duration`` to the second (they were kept to the nanosecond)."""

from __future__ import annotations

from typing import Any

import pytest
import requests
from google.cloud import tasks_v2
from google.protobuf import duration_pb2

from tasklease.emulator import CloudTasksEmulator

PARENT = "projects/p/locations/us-central1"
QUEUE = f"{PARENT}/queues/q"


@pytest.fixture(params=["rest", "grpc"])
def client(emulator: CloudTasksEmulator, request: pytest.FixtureRequest) -> Any:
    return emulator.client(request.param)


def test_list_tasks_pages_1000_by_default_and_coerces_larger_sizes(
    emulator: CloudTasksEmulator,
) -> None:
    emulator.create_queue(QUEUE)
    emulator.api.change_queue(QUEUE, "pause")
    for n in range(1001):
        emulator.api.create_task(
            QUEUE, {"task": {"name": f"{QUEUE}/tasks/t{n}", "httpRequest": {"url": "http://x/"}}}
        )
    url = f"{emulator.url}/v2/{QUEUE}/tasks"
    unspecified = requests.get(url, timeout=10).json()
    assert len(unspecified["tasks"]) == 1000
    assert unspecified["nextPageToken"]
    too_large = requests.get(url, params={"pageSize": 5000}, timeout=10).json()
    assert len(too_large["tasks"]) == 1000
    rest = requests.get(url, params={"pageToken": too_large["nextPageToken"]}, timeout=10).json()
    assert len(rest["tasks"]) == 1
    negative = requests.get(url, params={"pageSize": -1}, timeout=10)
    assert negative.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_list_queues_pages_up_to_9800(emulator: CloudTasksEmulator) -> None:
    for n in range(101):
        emulator.create_queue(f"{QUEUE}{n}")
    listed = requests.get(f"{emulator.url}/v2/{PARENT}/queues", timeout=10).json()
    assert len(listed["queues"]) == 101
    assert "nextPageToken" not in listed


def test_times_are_truncated_as_cloud_tasks_truncates_them(client: Any) -> None:
    queue = client.create_queue(
        parent=PARENT,
        queue=tasks_v2.Queue(
            name=QUEUE,
            retry_config=tasks_v2.RetryConfig(
                min_backoff=duration_pb2.Duration(seconds=1, nanos=123_456_789),
                max_backoff=duration_pb2.Duration(seconds=9, nanos=999_999_999),
                max_retry_duration=duration_pb2.Duration(seconds=30, nanos=700_000_000),
            ),
        ),
    )
    assert queue.retry_config.min_backoff.total_seconds() == 1.123
    assert queue.retry_config.max_backoff.total_seconds() == 9.999
    assert queue.retry_config.max_retry_duration.total_seconds() == 30
    client.pause_queue(name=QUEUE)
    created = client.create_task(
        parent=QUEUE,
        task=tasks_v2.Task(
            http_request=tasks_v2.HttpRequest(url="http://127.0.0.1:9/t"),
            dispatch_deadline=duration_pb2.Duration(seconds=20, nanos=123_456_789),
        ),
    )
    fetched = client.get_task(name=created.name)
    for task in (created, fetched):
        assert task.dispatch_deadline.total_seconds() == 20.123
        assert task.create_time.microsecond == 0
