"""Where the emulator follows the real Cloud Tasks in the details,
through the google-cloud-tasks client over both transports."""

from __future__ import annotations

import sqlite3
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from google.api_core import exceptions as api
from google.cloud import tasks_v2
from google.cloud.location import locations_pb2
from google.protobuf import field_mask_pb2, timestamp_pb2
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator.api import QUEUE_TOO_RECENT, TASK_GONE
from tests.support.emulator_target import Target

PARENT = "projects/p/locations/us-central1"
QUEUE = f"{PARENT}/queues/q"


@pytest.fixture(params=["rest", "grpc"])
def client(
    emulator: CloudTasksEmulator, request: pytest.FixtureRequest
) -> tasks_v2.CloudTasksClient:
    client: tasks_v2.CloudTasksClient = emulator.client(request.param)
    return client


def http_task(url: str, task_id: str | None = None, **fields: object) -> tasks_v2.Task:
    task = tasks_v2.Task(http_request=tasks_v2.HttpRequest(url=url), **fields)
    if task_id:
        task.name = f"{QUEUE}/tasks/{task_id}"
    return task


def test_list_locations_names_cloud_regions_with_their_region_label(
    client: tasks_v2.CloudTasksClient,
) -> None:
    response = client.list_locations(locations_pb2.ListLocationsRequest(name="projects/p"))
    ids = [location.location_id for location in response.locations]
    assert ids[0] == "us-central1"  # gcloud takes the first as the default location.
    assert {"europe-west1", "asia-northeast1", "us-east4"} <= set(ids)
    first = response.locations[0]
    assert first.name == "projects/p/locations/us-central1"
    assert dict(first.labels) == {"cloud.googleapis.com/region": "us-central1"}
    one = client.get_location(locations_pb2.GetLocationRequest(name=f"{PARENT}"))
    assert one.location_id == "us-central1"


@pytest.mark.parametrize("location", ["l", "global", "us", "us-central9"])
def test_location_ids_that_are_not_cloud_regions_are_refused(
    client: tasks_v2.CloudTasksClient, location: str
) -> None:
    parent = f"projects/p/locations/{location}"
    with pytest.raises(api.BadRequest, match="not a Cloud region"):
        client.create_queue(parent=parent, queue=tasks_v2.Queue(name=f"{parent}/queues/q"))


def test_list_queues_pages_and_filters_paused_queues(client: tasks_v2.CloudTasksClient) -> None:
    for n in range(5):
        client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=f"{QUEUE}{n}"))
    client.pause_queue(name=f"{QUEUE}1")
    client.pause_queue(name=f"{QUEUE}3")
    first = client.list_queues(request={"parent": PARENT, "page_size": 2})
    assert [q.name for q in first.queues] == [f"{QUEUE}0", f"{QUEUE}1"]
    assert first.next_page_token
    assert len(list(client.list_queues(request={"parent": PARENT, "page_size": 2}))) == 5
    paused = client.list_queues(request={"parent": PARENT, "filter": "state: PAUSED"})
    assert [q.name for q in paused] == [f"{QUEUE}1", f"{QUEUE}3"]
    with pytest.raises(api.BadRequest, match="filter"):
        list(client.list_queues(request={"parent": PARENT, "filter": "name: x"}))


def test_a_past_schedule_time_becomes_now(client: tasks_v2.CloudTasksClient) -> None:
    client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    client.pause_queue(name=QUEUE)
    past = timestamp_pb2.Timestamp()
    past.FromDatetime(datetime.now(UTC) - timedelta(days=3))
    before = datetime.now(UTC)
    task = client.create_task(parent=QUEUE, task=http_task("http://x/", schedule_time=past))
    assert task.schedule_time >= before - timedelta(seconds=1)


def test_output_only_queue_state_is_ignored_on_create_and_update(
    client: tasks_v2.CloudTasksClient,
) -> None:
    paused = tasks_v2.Queue(name=QUEUE, state=tasks_v2.Queue.State.PAUSED)
    assert client.create_queue(parent=PARENT, queue=paused).state == tasks_v2.Queue.State.RUNNING
    updated = client.update_queue(
        queue=paused, update_mask=field_mask_pb2.FieldMask(paths=["state"])
    )
    assert updated.state == tasks_v2.Queue.State.RUNNING
    assert client.get_queue(name=QUEUE).state == tasks_v2.Queue.State.RUNNING


def test_a_deleted_queues_name_is_refused_for_the_reuse_window(target: tuple[Target, str]) -> None:
    with CloudTasksEmulator(queue_reuse_window=1.0) as emulator:
        client = emulator.client("grpc")
        client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
        client.delete_queue(name=QUEUE)
        with pytest.raises(api.FailedPrecondition, match="existed too recently"):
            client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
        time.sleep(1.1)
        client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    assert "too recently" in QUEUE_TOO_RECENT


def test_a_deleted_or_finished_task_answers_the_real_services_message(
    client: tasks_v2.CloudTasksClient, emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    client.create_task(parent=QUEUE, task=http_task(target[1], "ran"))
    emulator.join()
    for call in (client.get_task, client.delete_task, client.run_task):
        with pytest.raises(api.NotFound) as raised:
            call(name=f"{QUEUE}/tasks/ran")
        assert TASK_GONE in str(raised.value)
    with pytest.raises(api.NotFound, match="not found"):
        client.get_task(name=f"{QUEUE}/tasks/never")


def test_unknown_custom_verbs_are_not_found_instead_of_creating_a_task(
    emulator: CloudTasksEmulator,
) -> None:
    emulator.create_queue(QUEUE)
    body = {"task": {"httpRequest": {"url": "http://127.0.0.1:9/"}}}
    for path in (f"{QUEUE}/tasks:frobnicate", f"{QUEUE}:frobnicate", f"{QUEUE}/tasks/t:frob"):
        response = requests.post(f"{emulator.url}/v2/{path}", json=body, timeout=5)
        assert response.status_code == 404, path
        assert response.json()["error"]["status"] == "NOT_FOUND"
    assert emulator.db.count_tasks() == 0


def test_run_task_on_a_task_being_dispatched_dispatches_it_again(
    client: tasks_v2.CloudTasksClient, emulator: CloudTasksEmulator, _target_server: HTTPServer
) -> None:
    started, release = threading.Event(), threading.Event()
    answers: list[int] = []

    def slow_then_ok(request: Request) -> Response:
        status = 500 if not answers else 200
        answers.append(status)
        if status == 500:
            started.set()
            release.wait(10)
        return Response("", status=status)

    _target_server.clear()
    _target_server.expect_request("/slow").respond_with_handler(slow_then_ok)
    retry = tasks_v2.RetryConfig(min_backoff={"seconds": 3600}, max_backoff={"seconds": 3600})
    client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE, retry_config=retry))
    client.create_task(parent=QUEUE, task=http_task(_target_server.url_for("/slow"), "busy"))
    assert started.wait(10)
    client.run_task(name=f"{QUEUE}/tasks/busy")  # In flight: no FAILED_PRECONDITION.
    release.set()
    emulator.join(timeout=10)  # Not an hour's backoff: the run dispatched it at once.
    _target_server.clear()
    assert answers == [500, 200]


def test_a_database_from_before_the_execution_count_opens_and_keeps_its_tasks(
    tmp_path: Path, target: tuple[Target, str]
) -> None:
    with CloudTasksEmulator(data_dir=tmp_path) as emulator:
        emulator.create_queue(QUEUE)
        emulator.client().pause_queue(name=QUEUE)
        emulator.client().create_task(parent=QUEUE, task=http_task(target[1], "old"))
    with sqlite3.connect(tmp_path / "emulator.db") as connection:
        connection.execute("ALTER TABLE tasks DROP COLUMN execution_count")
    with CloudTasksEmulator(data_dir=tmp_path) as emulator:
        emulator.client().resume_queue(name=QUEUE)
        emulator.join()
    assert target[0].hits[0].headers["X-Cloudtasks-Taskexecutioncount"] == "0"
