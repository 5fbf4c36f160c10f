"""Queue and Scheduler job settings: what gcloud describes and what the config wants, compared
with ``==`` field by field (tests/deploy/test_deploy.py runs them through a whole deploy)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tasklease.deploy.config import Queue
from tasklease.deploy.settings import JobSettings, QueueSettings
from tasklease.jobs import Job, Retry

URL = "https://tasklease-worker-123456789.us-central1.run.app"
INVOKER = "tasklease-invoker@my-project.iam.gserviceaccount.com"


def described_queue(**retry: Any) -> dict[str, Any]:
    """A queue as ``gcloud tasks queues describe --format=json`` gives it (durations as
    strings, zero durations left out)."""
    return {
        "name": "projects/my-project/locations/us-central1/queues/default",
        "rateLimits": {
            "maxBurstSize": 100,
            "maxConcurrentDispatches": 1000,
            "maxDispatchesPerSecond": 500.0,
        },
        "retryConfig": {
            "maxAttempts": 100,
            "maxBackoff": "3600s",
            "maxDoublings": 16,
            "minBackoff": "0.100s",
            **retry,
        },
        "state": "RUNNING",
    }


def described_job(**changes: Any) -> dict[str, Any]:
    """A job as ``gcloud scheduler jobs describe --format=json`` gives it."""
    return {
        "name": "projects/my-project/locations/us-central1/jobs/nightly",
        "schedule": "0 3 * * *",
        "timeZone": "Etc/UTC",
        "attemptDeadline": "180s",
        "httpTarget": {
            "uri": f"{URL}/jobs/nightly",
            "httpMethod": "POST",
            "oidcToken": {"serviceAccountEmail": INVOKER, "audience": URL},
        },
        "retryConfig": {
            "maxBackoffDuration": "3600s",
            "maxDoublings": 5,
            "maxRetryDuration": "0s",
            "minBackoffDuration": "5s",
        },
        "state": "ENABLED",
        **changes,
    }


def test_a_queue_described_as_configured_equals_the_wanted_settings() -> None:
    assert QueueSettings.described(described_queue()) == QueueSettings.wanted(Queue("default"))


@pytest.mark.parametrize(
    ("retry", "field", "value"),
    [
        ({"maxAttempts": 20}, "max_attempts", 20),
        ({"minBackoff": "1s"}, "min_backoff", 1.0),
        ({"maxRetryDuration": "3600s"}, "max_retry_duration", 3600.0),
    ],
)
def test_a_queue_differing_in_one_setting_is_unequal_in_that_field_alone(
    retry: dict[str, Any], field: str, value: Any
) -> None:
    current = QueueSettings.described(described_queue(**retry))
    wanted = QueueSettings.wanted(Queue("default"))
    assert current != wanted
    assert current == dataclasses.replace(wanted, **{field: value})


def test_queue_settings_are_frozen_and_hashable() -> None:
    settings = QueueSettings.wanted(Queue("default"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_attempts = 1  # type: ignore[misc]
    assert len({settings, QueueSettings.described(described_queue())}) == 1


def test_queue_flags_are_the_wanted_settings_in_gcloud_syntax() -> None:
    assert QueueSettings.wanted(Queue("default", max_attempts=20)).flags() == [
        "--max-attempts=20",
        "--max-retry-duration=0s",
        "--min-backoff=0.1s",
        "--max-backoff=3600s",
        "--max-doublings=16",
        "--max-dispatches-per-second=500",
        "--max-concurrent-dispatches=1000",
    ]


def test_a_job_described_as_configured_equals_the_wanted_settings() -> None:
    wanted = JobSettings.wanted(Job("nightly", "0 3 * * *"), URL, INVOKER)
    assert JobSettings.described(described_job()) == wanted


def test_a_job_described_without_its_defaults_reads_them_as_cloud_schedulers() -> None:
    """An absent attemptDeadline or backoff is Cloud Scheduler's default (3 min; 5 s to 1 h),
    as stated once in tasklease.jobs, not zero: no update is planned for a job left as is."""
    described = described_job()
    del described["attemptDeadline"]
    for key in ("minBackoffDuration", "maxBackoffDuration", "maxDoublings", "retryCount"):
        described["retryConfig"].pop(key, None)
    wanted = JobSettings.wanted(Job("nightly", "0 3 * * *"), URL, INVOKER)
    assert JobSettings.described(described) == wanted


def test_a_job_whose_token_names_another_account_is_unequal() -> None:
    other = described_job()
    other["httpTarget"]["oidcToken"]["serviceAccountEmail"] = "someone@else.example"
    wanted = JobSettings.wanted(Job("nightly", "0 3 * * *"), URL, INVOKER)
    assert JobSettings.described(other) != wanted
    assert JobSettings.described(other) == dataclasses.replace(
        wanted, service_account="someone@else.example"
    )


def test_a_job_with_another_schedule_or_retry_count_is_unequal() -> None:
    wanted = JobSettings.wanted(Job("nightly", "0 3 * * *"), URL, INVOKER)
    assert JobSettings.described(described_job(schedule="30 4 * * 1-5")) != wanted
    retried = described_job()
    retried["retryConfig"]["retryCount"] = 3
    assert JobSettings.described(retried) == dataclasses.replace(wanted, retry_count=3)


def test_job_flags_carry_the_uri_token_and_retry_settings() -> None:
    job = Job("nightly", "0 3 * * *", retry=Retry(retry_count=3))
    flags = JobSettings.wanted(job, URL, INVOKER).flags()
    assert flags == [
        "--schedule=0 3 * * *",
        "--time-zone=Etc/UTC",
        f"--uri={URL}/jobs/nightly",
        "--http-method=POST",
        f"--oidc-service-account-email={INVOKER}",
        f"--oidc-token-audience={URL}",
        "--attempt-deadline=180s",
        "--description=",
        "--max-retry-attempts=3",
        "--max-retry-duration=0s",
        "--min-backoff=5s",
        "--max-backoff=3600s",
        "--max-doublings=5",
    ]


def test_a_jobs_description_and_max_retry_duration_are_deployed_and_compared() -> None:
    job = Job("nightly", "0 3 * * *", description="reports", retry=Retry(max_retry_duration=600))
    wanted = JobSettings.wanted(job, URL, INVOKER)
    assert {"--description=reports", "--max-retry-duration=600s"} <= set(wanted.flags())
    described = described_job()
    assert JobSettings.described(described) != wanted
    described["description"] = "reports"
    described["retryConfig"]["maxRetryDuration"] = "600s"
    assert JobSettings.described(described) == wanted
