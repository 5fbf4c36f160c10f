"""CreateTask in a queue that does not exist, or existed recently, answers FAILED_PRECONDITION
with Cloud Tasks' own messages (it answered NOT_FOUND, so code that catches the real error to
create the queue never ran); UpdateQueue on a missing queue creates it, as the real method does
("This method creates the queue if it does not exist", UpdateQueue in google-cloud-tasks v2)."""

from __future__ import annotations

from typing import Any

import pytest
import requests
from google.api_core import exceptions as api
from google.cloud import tasks_v2
from google.protobuf import field_mask_pb2

from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator.api import QUEUE_GONE, QUEUE_MISSING

PARENT = "projects/p/locations/us-central1"
QUEUE = f"{PARENT}/queues/q"


@pytest.fixture(params=["rest", "grpc"])
def client(emulator: CloudTasksEmulator, request: pytest.FixtureRequest) -> Any:
    return emulator.client(request.param)


def status_of(error: api.GoogleAPICallError) -> str:
    """The google.rpc status name, whatever HTTP code the REST transport mapped it to."""
    if isinstance(error.response, requests.Response):
        return str(error.response.json()["error"]["status"])
    assert error.grpc_status_code is not None
    return str(error.grpc_status_code.name)


def task() -> tasks_v2.Task:
    return tasks_v2.Task(http_request=tasks_v2.HttpRequest(url="http://127.0.0.1:9/t"))


def test_create_task_in_a_missing_queue_is_a_failed_precondition(client: Any) -> None:
    with pytest.raises(api.GoogleAPICallError) as raised:
        client.create_task(parent=QUEUE, task=task())
    assert status_of(raised.value) == "FAILED_PRECONDITION"
    assert QUEUE_MISSING in str(raised.value)


def test_create_task_in_a_recently_deleted_queue_says_it_existed_recently(client: Any) -> None:
    client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    client.delete_queue(name=QUEUE)
    with pytest.raises(api.GoogleAPICallError) as raised:
        client.create_task(parent=QUEUE, task=task())
    assert status_of(raised.value) == "FAILED_PRECONDITION"
    assert QUEUE_GONE in str(raised.value)


def test_update_queue_creates_a_missing_queue_with_the_masked_fields(client: Any) -> None:
    queue = client.update_queue(
        queue=tasks_v2.Queue(
            name=QUEUE,
            retry_config=tasks_v2.RetryConfig(max_attempts=7, max_doublings=3),
        ),
        update_mask=field_mask_pb2.FieldMask(paths=["retry_config.max_attempts"]),
    )
    assert queue.name == QUEUE
    assert queue.state == tasks_v2.Queue.State.RUNNING
    assert queue.retry_config.max_attempts == 7
    assert queue.retry_config.max_doublings == 16  # Not in the mask: the default.
    assert client.get_queue(name=QUEUE).retry_config.max_attempts == 7
    client.create_task(parent=QUEUE, task=task())
