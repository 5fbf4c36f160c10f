"""Every ``gcloud scheduler jobs`` command the issue names, against the emulator."""

from __future__ import annotations

from datetime import UTC, datetime

from tasklease.emulator import CloudTasksEmulator
from tasklease.worker.core.identity import parse_rfc3339
from tests.conformance.conftest import LOCATION, PROJECT, Gcloud
from tests.support.emulator_target import Target

WHERE = f"--location={LOCATION}"
JOB = f"projects/{PROJECT}/locations/{LOCATION}/jobs/nightly"
SA = "scheduler@test-project.iam.gserviceaccount.com"


def test_job_commands_and_a_manual_run(
    gcloud: Gcloud, conformance_emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    created = gcloud(
        "scheduler", "jobs", "create", "http", "nightly", WHERE, "--schedule=0 3 * * *",
        f"--uri={url}", "--headers=X-Tenant=acme", '--message-body={"n": 1}',
        f"--oidc-service-account-email={SA}", "--max-retry-attempts=2", "--attempt-deadline=60s",
    )  # fmt: skip
    assert created["name"] == JOB
    assert created["state"] == "ENABLED"
    assert created["retryConfig"]["retryCount"] == 2
    assert created["attemptDeadline"] == "60s"
    assert "ALREADY_EXISTS" in gcloud.fails(
        "scheduler", "jobs", "create", "http", "nightly", WHERE, "--schedule=0 3 * * *",
        f"--uri={url}",
    )  # fmt: skip
    # No --location: gcloud resolves it through App Engine and ListLocations.
    assert [job["name"] for job in gcloud("scheduler", "jobs", "list")] == [JOB]
    updated = gcloud(
        "scheduler", "jobs", "update", "http", "nightly", WHERE, "--schedule=0 4 * * *"
    )
    assert updated["schedule"] == "0 4 * * *"
    assert updated["httpTarget"]["uri"] == url
    gcloud("scheduler", "jobs", "pause", "nightly", WHERE)
    assert gcloud("scheduler", "jobs", "describe", "nightly", WHERE)["state"] == "PAUSED"
    gcloud("scheduler", "jobs", "resume", "nightly", WHERE)
    described = gcloud("scheduler", "jobs", "describe", "nightly", WHERE)
    assert described["state"] == "ENABLED"
    assert parse_rfc3339(described["scheduleTime"]).hour == 4  # type: ignore[union-attr]
    gcloud("scheduler", "jobs", "run", "nightly", WHERE)
    assert conformance_emulator.scheduler.join(timeout=10)
    [hit] = recorder.hits
    assert hit.headers["X-Cloudscheduler"] == "true"
    assert hit.headers["X-Cloudscheduler-Jobname"] == "nightly"
    assert hit.headers["X-Tenant"] == "acme"
    assert hit.headers["Authorization"].startswith("Bearer ")
    assert hit.body == b'{"n": 1}'
    # A manual run carries the next scheduled slot and arrives before it (docs/platform-facts.md).
    when = parse_rfc3339(hit.headers["X-Cloudscheduler-Scheduletime"])
    assert when is not None and when.hour == 4 and when > datetime.now(UTC)
    gcloud("scheduler", "jobs", "delete", "nightly", WHERE)
    assert "NOT_FOUND" in gcloud.fails("scheduler", "jobs", "describe", "nightly", WHERE)
