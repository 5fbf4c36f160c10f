"""BatchCreateTasks, a Cloud Tasks v2 call of google-cloud-tasks 2.26 that the emulator did not
serve, through Google's client over both transports. Documented: at most 100 requests of one
queue, the created tasks in the operation's response, the failed ones by index in its metadata
(PARTIALLY_SUCCEEDED), ``request_id`` de-duplicating a retried batch. Chosen (see
tasklease/emulator/batch.py): each request behaves as its own CreateTask."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions as api
from google.cloud import tasks_v2

from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator.api import TASK_EXISTS
from tasklease.emulator.batch import ALL_FAILED

PARENT = "projects/p/locations/us-central1"
QUEUE = f"{PARENT}/queues/q"
State = tasks_v2.BatchCreateTasksMetadata.State


@pytest.fixture(params=["rest", "grpc"])
def client(emulator: CloudTasksEmulator, request: pytest.FixtureRequest) -> Any:
    client = emulator.client(request.param)
    client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    client.pause_queue(name=QUEUE)
    return client


def create(task_id: str | None = None, url: str = "http://127.0.0.1:9/t") -> Any:
    task = tasks_v2.Task(http_request=tasks_v2.HttpRequest(url=url, body=b"x"))
    if task_id:
        task.name = f"{QUEUE}/tasks/{task_id}"
    return tasks_v2.CreateTaskRequest(parent=QUEUE, task=task)


def test_a_batch_creates_its_tasks_and_reports_the_failed_ones_by_index(client: Any) -> None:
    client.create_task(request=create("taken"))
    operation = client.batch_create_tasks(
        parent=QUEUE,
        requests=[
            create("a"),
            create("taken"),
            create(),
            create("bad", url="ftp://x"),
            create("a"),
        ],
    )
    response = operation.result(timeout=10)
    assert [task.name.rsplit("/", 1)[-1] for task in response.tasks][:1] == ["a"]
    assert len(response.tasks) == 2  # "a" and the unnamed one.
    assert response.tasks[0].http_request.body == b""  # CreateTask's BASIC view.
    metadata = operation.metadata
    assert metadata.state == State.PARTIALLY_SUCCEEDED
    failed = dict(metadata.failed_requests)
    assert sorted(failed) == [1, 3, 4]
    assert failed[1].code == 6 and TASK_EXISTS in failed[1].message  # ALREADY_EXISTS.
    assert failed[3].code == 3  # INVALID_ARGUMENT.
    assert failed[4].code == 6  # The batch's own earlier "a".
    assert len(list(client.list_tasks(parent=QUEUE))) == 3


def test_a_whole_batch_succeeds(client: Any) -> None:
    operation = client.batch_create_tasks(parent=QUEUE, requests=[create("x"), create("y")])
    assert len(operation.result(timeout=10).tasks) == 2
    assert operation.metadata.state == State.SUCCEEDED
    assert not operation.metadata.failed_requests


def test_a_retried_request_id_answers_the_first_operation_without_creating_again(
    client: Any,
) -> None:
    request = tasks_v2.BatchCreateTasksRequest(
        parent=QUEUE,
        requests=[create(), create()],
        request_id="6a1c1f3e-0a0b-4c1d-9e2f-1a2b3c4d5e6f",
    )
    first = client.batch_create_tasks(request=request)
    again = client.batch_create_tasks(request=request)
    assert again.operation.name == first.operation.name
    assert [t.name for t in again.result().tasks] == [t.name for t in first.result().tasks]
    assert len(list(client.list_tasks(parent=QUEUE))) == 2


def test_a_batch_whose_every_request_fails_is_aborted(client: Any) -> None:
    operation = client.batch_create_tasks(parent=QUEUE, requests=[create(url="ftp://x")])
    with pytest.raises(api.Aborted, match=ALL_FAILED.split(",")[0]):
        operation.result(timeout=10)
    assert dict(operation.metadata.failed_requests)[0].code == 3


def test_batch_level_faults_fail_the_call(client: Any) -> None:
    with pytest.raises(api.BadRequest, match="at most 100"):
        client.batch_create_tasks(parent=QUEUE, requests=[create() for _ in range(101)])
    with pytest.raises(api.BadRequest, match="requests is required"):
        client.batch_create_tasks(parent=QUEUE, requests=[])
    other = tasks_v2.CreateTaskRequest(parent=f"{QUEUE}2", task=create().task)
    with pytest.raises(api.BadRequest, match="parent"):
        client.batch_create_tasks(parent=QUEUE, requests=[other])
    missing = f"{PARENT}/queues/missing"
    with pytest.raises(api.GoogleAPICallError, match="Queue does not exist"):
        client.batch_create_tasks(
            parent=missing, requests=[tasks_v2.CreateTaskRequest(parent=missing)]
        )


def test_the_operation_is_kept_for_get_operation(emulator: CloudTasksEmulator, client: Any) -> None:
    operation = client.batch_create_tasks(parent=QUEUE, requests=[create("kept")])
    name = operation.operation.name
    assert name.startswith(f"{PARENT}/operations/")
    fetched = client.get_operation(request={"name": name})
    assert fetched.done and fetched.name == name
    with pytest.raises(api.NotFound):
        client.get_operation(request={"name": f"{PARENT}/operations/nope"})
