"""A task name reused while its tombstone lasts answers ALREADY_EXISTS with Cloud Tasks' "existed
too recently" message (it answered "Requested entity already exists", the message for a task
that still exists, which keeps its own wording)."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions as api
from google.cloud import tasks_v2

from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator.api import TASK_EXISTS, TASK_TOO_RECENT

PARENT = "projects/p/locations/us-central1"
QUEUE = f"{PARENT}/queues/q"


@pytest.fixture(params=["rest", "grpc"])
def client(emulator: CloudTasksEmulator, request: pytest.FixtureRequest) -> Any:
    client = emulator.client(request.param)
    client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    client.pause_queue(name=QUEUE)
    return client


def task(task_id: str) -> tasks_v2.Task:
    return tasks_v2.Task(
        name=f"{QUEUE}/tasks/{task_id}",
        http_request=tasks_v2.HttpRequest(url="http://127.0.0.1:9/t"),
    )


def test_a_deleted_name_reused_too_soon_says_it_existed_too_recently(client: Any) -> None:
    client.create_task(parent=QUEUE, task=task("once"))
    with pytest.raises(api.Conflict) as still_there:
        client.create_task(parent=QUEUE, task=task("once"))
    assert TASK_EXISTS in str(still_there.value)
    client.delete_task(name=f"{QUEUE}/tasks/once")
    with pytest.raises(api.Conflict) as too_soon:
        client.create_task(parent=QUEUE, task=task("once"))
    assert "existed too recently" in str(too_soon.value)
    assert TASK_TOO_RECENT in str(too_soon.value)
