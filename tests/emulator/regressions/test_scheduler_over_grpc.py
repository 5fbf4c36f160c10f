"""Cloud Scheduler answers over gRPC, the default transport of Google's Scheduler clients, on
the Cloud Tasks gRPC port (it answered UNIMPLEMENTED), sharing the REST API's jobs."""

from __future__ import annotations

import grpc
import pytest
from google.api_core import exceptions as api
from google.cloud import scheduler_v1
from google.cloud.scheduler_v1.services.cloud_scheduler.transports import (
    CloudSchedulerGrpcTransport,
)
from google.protobuf import field_mask_pb2

from tasklease.emulator import CloudTasksEmulator
from tests.emulator.test_emulator_scheduler_api import JOB, PARENT, http_job, scheduler_client


def grpc_client(emulator: CloudTasksEmulator) -> scheduler_v1.CloudSchedulerClient:
    channel = grpc.insecure_channel(emulator.grpc_target)
    return scheduler_v1.CloudSchedulerClient(transport=CloudSchedulerGrpcTransport(channel=channel))


def test_every_scheduler_call_answers_over_grpc_and_shares_the_rest_apis_jobs(
    emulator: CloudTasksEmulator,
) -> None:
    client = grpc_client(emulator)
    created = client.create_job(parent=PARENT, job=http_job("http://127.0.0.1:9/x"))
    assert created.state == scheduler_v1.Job.State.ENABLED
    assert created.attempt_deadline.total_seconds() == 180
    with pytest.raises(api.AlreadyExists):
        client.create_job(parent=PARENT, job=http_job("http://127.0.0.1:9/x"))
    assert scheduler_client(emulator).get_job(name=JOB).schedule == "0 3 * * *"  # One store.
    assert [job.name for job in client.list_jobs(parent=PARENT)] == [JOB]
    updated = client.update_job(
        job=scheduler_v1.Job(name=JOB, schedule="30 4 * * *"),
        update_mask=field_mask_pb2.FieldMask(paths=["schedule"]),
    )
    assert updated.schedule == "30 4 * * *"
    assert updated.http_target.uri == "http://127.0.0.1:9/x"
    assert client.pause_job(name=JOB).state == scheduler_v1.Job.State.PAUSED
    assert client.resume_job(name=JOB).state == scheduler_v1.Job.State.ENABLED
    assert client.run_job(name=JOB).name == JOB
    client.delete_job(name=JOB)
    with pytest.raises(api.NotFound):
        client.get_job(name=JOB)
    with pytest.raises(api.InvalidArgument):
        client.create_job(parent=PARENT, job=scheduler_v1.Job(name=JOB, schedule="0 3 * * *"))
