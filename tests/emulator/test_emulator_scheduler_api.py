"""The Cloud Scheduler v1 API on the emulator's port, through Google's own scheduler client."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from google.api_core import exceptions as api
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import scheduler_v1
from google.protobuf import duration_pb2, field_mask_pb2
from werkzeug import Response

from tasklease.emulator import CloudTasksEmulator
from tasklease.worker.core.identity import parse_rfc3339
from tests.support.emulator_target import Target

PARENT = "projects/p/locations/us-central1"
JOB = f"{PARENT}/jobs/nightly"
SA = "scheduler@p.iam.gserviceaccount.com"


def scheduler_client(emulator: CloudTasksEmulator) -> scheduler_v1.CloudSchedulerClient:
    return scheduler_v1.CloudSchedulerClient(
        transport="rest",
        client_options=ClientOptions(api_endpoint=emulator.url),
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
    )


def http_job(url: str, schedule: str = "0 3 * * *", **fields: object) -> scheduler_v1.Job:
    return scheduler_v1.Job(
        name=JOB,
        schedule=schedule,
        http_target=scheduler_v1.HttpTarget(
            uri=url,
            body=b'{"n": 1}',
            headers={"Content-Type": "application/json"},
            oidc_token=scheduler_v1.OidcToken(service_account_email=SA),
        ),
        **fields,
    )


def test_jobs_are_created_listed_updated_paused_resumed_and_deleted(
    emulator: CloudTasksEmulator,
) -> None:
    client = scheduler_client(emulator)
    created = client.create_job(parent=PARENT, job=http_job("http://127.0.0.1:9/x"))
    assert created.state == scheduler_v1.Job.State.ENABLED
    assert created.retry_config.retry_count == 0
    assert created.retry_config.min_backoff_duration.total_seconds() == 5
    assert created.attempt_deadline.total_seconds() == 180
    assert created.schedule_time.hour == 3 and created.schedule_time > datetime.now(UTC)
    with pytest.raises(api.Conflict):
        client.create_job(parent=PARENT, job=http_job("http://127.0.0.1:9/x"))
    assert [job.name for job in client.list_jobs(parent=PARENT)] == [JOB]
    updated = client.update_job(
        job=scheduler_v1.Job(name=JOB, schedule="30 4 * * *"),
        update_mask=field_mask_pb2.FieldMask(paths=["schedule"]),
    )
    assert updated.schedule == "30 4 * * *"
    assert updated.http_target.uri == "http://127.0.0.1:9/x"  # Not in the mask.
    assert client.pause_job(name=JOB).state == scheduler_v1.Job.State.PAUSED
    assert JOB not in emulator.scheduler.jobs
    assert client.resume_job(name=JOB).state == scheduler_v1.Job.State.ENABLED
    assert emulator.scheduler.jobs[JOB].schedule == "30 4 * * *"
    client.delete_job(name=JOB)
    with pytest.raises(api.NotFound):
        client.get_job(name=JOB)
    assert JOB not in emulator.scheduler.jobs


@pytest.mark.parametrize(
    ("job", "message"),
    [
        (scheduler_v1.Job(name=JOB, schedule="every day"), "httpTarget.uri"),
        (http_job("http://x/", schedule="every day"), "unix-cron"),
        (http_job("http://x/", time_zone="Mars/Olympus"), "time zone"),
        (http_job("ftp://x/"), "http"),
        (http_job("http://x/", attempt_deadline=duration_pb2.Duration(seconds=5)), "15 seconds"),
        (
            http_job("http://x/", retry_config=scheduler_v1.RetryConfig(retry_count=6)),
            "retryCount",
        ),
    ],
)
def test_invalid_jobs_are_refused_with_invalid_argument(
    emulator: CloudTasksEmulator, job: scheduler_v1.Job, message: str
) -> None:
    with pytest.raises(api.BadRequest, match=message):
        scheduler_client(emulator).create_job(parent=PARENT, job=job)


def test_a_manual_run_sends_the_next_scheduled_slot_before_it(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    client = scheduler_client(emulator)
    client.create_job(parent=PARENT, job=http_job(url))
    client.pause_job(name=JOB)  # A paused job still runs by hand.
    client.run_job(name=JOB)
    assert emulator.scheduler.join(timeout=10)
    [hit] = recorder.hits
    assert hit.headers["X-Cloudscheduler"] == "true"
    assert hit.headers["X-Cloudscheduler-Jobname"] == "nightly"  # The short job ID.
    when = parse_rfc3339(hit.headers["X-Cloudscheduler-Scheduletime"])
    assert when is not None and when.hour == 3 and when > datetime.now(UTC)
    assert hit.headers["Authorization"].startswith("Bearer ")
    assert hit.body == b'{"n": 1}'
    assert client.get_job(name=JOB).last_attempt_time.timestamp() > time.time() - 10


def test_api_jobs_fire_on_schedule_with_their_retry_config(
    emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    recorder.answer = lambda n: Response("no", status=500) if n % 2 == 1 else Response("ok")
    retry = scheduler_v1.RetryConfig(
        retry_count=1, min_backoff_duration=duration_pb2.Duration(nanos=10_000_000)
    )
    client = scheduler_client(emulator)
    # croniter's sixth field is seconds (an emulator extension): fires every 2 seconds.
    client.create_job(parent=PARENT, job=http_job(url, "* * * * * */2", retry_config=retry))
    deadline = time.monotonic() + 10
    while len(recorder.hits) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    client.delete_job(name=JOB)
    first, second = recorder.hits[:2]
    assert (
        first.headers["X-Cloudscheduler-Scheduletime"]
        == (second.headers["X-Cloudscheduler-Scheduletime"])
    )  # The retry of one run carries that run's time.


def test_api_jobs_survive_a_restart(tmp_path: Path, target: tuple[Target, str]) -> None:
    with CloudTasksEmulator(data_dir=tmp_path) as emulator:
        scheduler_client(emulator).create_job(parent=PARENT, job=http_job(target[1]))
    with CloudTasksEmulator(data_dir=tmp_path, scheduler_on_schedule=False) as emulator:
        assert scheduler_client(emulator).get_job(name=JOB).schedule == "0 3 * * *"
        assert emulator.scheduler.run_job(JOB).result(timeout=10)
    assert len(target[0].hits) == 1
