"""The calls Google's Cloud Tasks samples make, against the emulator, over both transports.

Nothing is vendored: each test makes the same client calls, with the same request shapes, as
the sample it cites in GoogleCloudPlatform/python-docs-samples, cloud_tasks/snippets/. The
samples build ``tasks_v2.CloudTasksClient()``, whose default transport is gRPC.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from google.cloud import tasks_v2
from google.protobuf import duration_pb2, timestamp_pb2

from tasklease.emulator import CloudTasksEmulator
from tasklease.worker.auth.authenticators import AuthRequest, OidcAuth
from tasklease.worker.core.identity import Kind
from tasklease.worker.handlers.router import HandlerSpec
from tests.support.emulator_target import Target

PROJECT, LOCATION, QUEUE_ID = "my-project-id", "us-central1", "my-queue"
SA = "service-account@my-project-id.iam.gserviceaccount.com"


@pytest.fixture(params=["grpc", "rest"])
def client(
    emulator: CloudTasksEmulator, request: pytest.FixtureRequest
) -> tasks_v2.CloudTasksClient:
    client: tasks_v2.CloudTasksClient = emulator.client(request.param)
    return client


def create_queue(client: tasks_v2.CloudTasksClient) -> tasks_v2.Queue:
    # cloud_tasks/snippets/create_queue.py
    parent = f"projects/{PROJECT}/locations/{LOCATION}"
    queue = {"name": client.queue_path(PROJECT, LOCATION, QUEUE_ID)}
    return client.create_queue(request={"parent": parent, "queue": queue})


def test_create_queue_sample(client: tasks_v2.CloudTasksClient) -> None:
    response = create_queue(client)
    assert response.name == f"projects/{PROJECT}/locations/{LOCATION}/queues/{QUEUE_ID}"


def test_list_queues_sample(client: tasks_v2.CloudTasksClient) -> None:
    create_queue(client)
    # cloud_tasks/snippets/list_queues.py
    parent = f"projects/{PROJECT}/locations/{LOCATION}"
    response = client.list_queues(request={"parent": parent})
    assert [queue.name for queue in response] == [client.queue_path(PROJECT, LOCATION, QUEUE_ID)]


def test_delete_queue_sample(client: tasks_v2.CloudTasksClient) -> None:
    create_queue(client)
    # cloud_tasks/snippets/delete_queue.py
    client.delete_queue(
        tasks_v2.DeleteQueueRequest(name=client.queue_path(PROJECT, LOCATION, QUEUE_ID))
    )
    parent = f"projects/{PROJECT}/locations/{LOCATION}"
    assert list(client.list_queues(request={"parent": parent})) == []


def test_create_http_task_sample(
    client: tasks_v2.CloudTasksClient, emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    create_queue(client)
    # cloud_tasks/snippets/create_http_task.py, with payload, in_seconds, task_name, deadline.
    parent = client.queue_path(PROJECT, LOCATION, QUEUE_ID)
    task: dict[str, Any] = {"http_request": {"http_method": tasks_v2.HttpMethod.POST, "url": url}}
    payload = json.dumps({"param": "value"})
    task["http_request"]["headers"] = {"Content-type": "application/json"}
    task["http_request"]["body"] = payload.encode()
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1)
    timestamp = timestamp_pb2.Timestamp()
    timestamp.FromDatetime(moment)
    task["schedule_time"] = timestamp
    task["name"] = client.task_path(PROJECT, LOCATION, QUEUE_ID, "my-unique-task")
    duration = duration_pb2.Duration()
    duration.FromSeconds(900)
    task["dispatch_deadline"] = duration
    response = client.create_task(request={"parent": parent, "task": task})
    assert response.name == task["name"]
    emulator.join(timeout=10)
    [hit] = recorder.hits
    assert json.loads(hit.body) == {"param": "value"}
    assert hit.headers["Content-Type"] == "application/json"
    assert float(hit.headers["X-Cloudtasks-Tasketa"]) >= moment.timestamp() - 1e-3


def test_create_http_task_with_token_sample(
    client: tasks_v2.CloudTasksClient, emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    create_queue(client)
    # cloud_tasks/snippets/create_http_task_with_token.py (audience left None, as by default).
    parent = client.queue_path(PROJECT, LOCATION, QUEUE_ID)
    task = {
        "http_request": {
            "http_method": tasks_v2.HttpMethod.POST,
            "url": url,
            "oidc_token": {"service_account_email": SA, "audience": None},
        }
    }
    task["http_request"]["body"] = b"hello"
    response = client.create_task(request={"parent": parent, "task": task})
    assert response.name.startswith(parent + "/tasks/")
    emulator.join(timeout=10)
    [hit] = recorder.hits
    assert hit.body == b"hello"
    auth = OidcAuth([SA], audience=url, certs_url=emulator.certs_url)  # Audience: the URL.
    spec = HandlerSpec(Kind.TASK, "hit", lambda p, c: None)
    result = auth.authenticate(AuthRequest(hit.headers["Authorization"], url), spec)
    assert (result.status, result.principal) == (200, SA)
