"""An UpdateQueue or UpdateJob whose update_mask names a field the resource does not have (a
typo such as ``retry_config.max_atempts``) answers INVALID_ARGUMENT naming the path, as
Google's services refuse an invalid FieldMask; it answered OK and changed nothing, so the
caller never learned that the setting it meant to change was left as it was."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
import requests
from google.api_core import exceptions as api
from google.cloud import scheduler_v1, tasks_v2
from google.cloud.scheduler_v1.services.cloud_scheduler.transports import (
    CloudSchedulerGrpcTransport,
)
from google.protobuf import field_mask_pb2

from tasklease.emulator import CloudTasksEmulator
from tests.emulator.test_emulator_scheduler_api import JOB, PARENT, http_job, scheduler_client

QUEUE = f"{PARENT}/queues/q"


@pytest.fixture(params=["rest", "grpc"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def tasks_client(emulator: CloudTasksEmulator, transport: str) -> Any:
    client = emulator.client(transport)
    client.create_queue(
        parent=PARENT,
        queue=tasks_v2.Queue(name=QUEUE, retry_config=tasks_v2.RetryConfig(max_attempts=5)),
    )
    return client


def status_of(error: api.GoogleAPICallError) -> str:
    """The google.rpc status name, whatever HTTP code the REST transport mapped it to."""
    if isinstance(error.response, requests.Response):
        return str(error.response.json()["error"]["status"])
    assert error.grpc_status_code is not None
    return str(error.grpc_status_code.name)


def jobs_client(emulator: CloudTasksEmulator, transport: str) -> scheduler_v1.CloudSchedulerClient:
    if transport == "rest":
        return scheduler_client(emulator)
    channel = grpc.insecure_channel(emulator.grpc_target)
    return scheduler_v1.CloudSchedulerClient(transport=CloudSchedulerGrpcTransport(channel=channel))


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("retry_config.max_atempts", "retryConfig.maxAtempts"),
        ("retry_limits", "retryLimits"),
        ("http_target.uri_override.port.number", "httpTarget.uriOverride.port.number"),
    ],
)
def test_update_queue_refuses_a_mask_path_that_names_no_queue_field(
    emulator: CloudTasksEmulator, transport: str, path: str, named: str
) -> None:
    client = tasks_client(emulator, transport)
    update = tasks_v2.Queue(name=QUEUE, retry_config=tasks_v2.RetryConfig(max_attempts=9))
    with pytest.raises(api.BadRequest) as refused:
        client.update_queue(queue=update, update_mask=field_mask_pb2.FieldMask(paths=[path]))
    assert status_of(refused.value) == "INVALID_ARGUMENT"
    assert f"updateMask path {named!r} is not a field of Queue" in str(refused.value)
    assert client.get_queue(name=QUEUE).retry_config.max_attempts == 5


def test_update_queue_of_a_missing_queue_refuses_the_path_and_creates_nothing(
    emulator: CloudTasksEmulator, transport: str
) -> None:
    client = emulator.client(transport)
    update = tasks_v2.Queue(name=QUEUE, retry_config=tasks_v2.RetryConfig(max_attempts=9))
    mask = field_mask_pb2.FieldMask(paths=["retry_config.max_atempts"])
    with pytest.raises(api.BadRequest) as refused:
        client.update_queue(queue=update, update_mask=mask)
    assert status_of(refused.value) == "INVALID_ARGUMENT"
    with pytest.raises(api.NotFound):
        client.get_queue(name=QUEUE)


def test_update_job_refuses_a_mask_path_that_names_no_job_field(
    emulator: CloudTasksEmulator, transport: str
) -> None:
    client = jobs_client(emulator, transport)
    client.create_job(parent=PARENT, job=http_job("http://127.0.0.1:9/x"))
    with pytest.raises(api.BadRequest) as refused:
        client.update_job(
            job=scheduler_v1.Job(name=JOB, schedule="30 4 * * *"),
            update_mask=field_mask_pb2.FieldMask(paths=["shedule"]),
        )
    assert status_of(refused.value) == "INVALID_ARGUMENT"
    assert "updateMask path 'shedule' is not a field of Job" in str(refused.value)
    assert client.get_job(name=JOB).schedule == "0 3 * * *"


def test_a_mask_naming_real_and_output_only_fields_still_updates(
    emulator: CloudTasksEmulator, transport: str
) -> None:
    """The check refuses only paths that name no field: output-only ones stay ignored."""
    client = tasks_client(emulator, transport)
    update = tasks_v2.Queue(name=QUEUE, retry_config=tasks_v2.RetryConfig(max_attempts=9))
    mask = field_mask_pb2.FieldMask(paths=["retry_config.max_attempts", "state", "purge_time"])
    assert client.update_queue(queue=update, update_mask=mask).retry_config.max_attempts == 9
