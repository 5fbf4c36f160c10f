"""Finding: a unix-cron schedule that croniter parses but that never fires (``0 0 31 2 *``:
February has no 31st) stopped Cloud Scheduler for every job. CreateJob stored the job and
then answered 500 (with an HTML page) when it asked for the next run; ListJobs answered 500
from then on; the scheduler thread died on croniter's CroniterBadDateError, and died again at
every restart on the same data, so no job fired. Cloud Scheduler refuses what it cannot
schedule (INVALID_ARGUMENT), and one job's bad data must not stop the others."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from google.api_core import exceptions as api
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import scheduler_v1

from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator.db import EmulatorDB
from tasklease.emulator.job_table import JobTable
from tasklease.jobs import Job
from tasklease.worker.operate.stuck_schedules import overdue_jobs
from tasklease.worker.stores import MemoryStore
from tests.support.emulator_target import Target

PARENT = "projects/p/locations/us-central1"
NEVER = "0 0 31 2 *"


def client(emulator: CloudTasksEmulator) -> scheduler_v1.CloudSchedulerClient:
    return scheduler_v1.CloudSchedulerClient(
        transport="rest",
        client_options=ClientOptions(api_endpoint=emulator.url),
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
    )


def stored_job(name: str, schedule: str, url: str) -> dict[str, object]:
    """A job as the API stores it, written as an older emulator would have let it be."""
    return {
        "name": f"{PARENT}/jobs/{name}",
        "schedule": schedule,
        "timeZone": "Etc/UTC",
        "httpTarget": {"uri": url, "httpMethod": "POST"},
        "retryConfig": {
            "retryCount": 0,
            "maxRetryDuration": "0s",
            "minBackoffDuration": "5s",
            "maxBackoffDuration": "3600s",
            "maxDoublings": 5,
        },
        "attemptDeadline": "180s",
        "state": "ENABLED",
    }


def test_a_schedule_that_never_fires_is_refused_and_nothing_is_stored(
    target: tuple[Target, str],
) -> None:
    _, url = target
    with CloudTasksEmulator() as emulator:
        jobs = client(emulator)
        job = scheduler_v1.Job(
            name=f"{PARENT}/jobs/never",
            schedule=NEVER,
            http_target=scheduler_v1.HttpTarget(uri=url),
        )
        with pytest.raises(api.BadRequest, match="never fires"):
            jobs.create_job(parent=PARENT, job=job)
        assert list(jobs.list_jobs(parent=PARENT)) == []


def test_a_stored_job_that_never_fires_stops_no_other_job(
    target: tuple[Target, str], tmp_path: Path
) -> None:
    recorder, url = target
    db = EmulatorDB(tmp_path / "emulator.db")
    for name, schedule in (("a-never", NEVER), ("b-every-second", "* * * * * *")):
        spec = stored_job(name, schedule, url)
        JobTable(db).put(str(spec["name"]), spec)
    db.close()
    with CloudTasksEmulator(data_dir=tmp_path) as emulator:
        deadline = time.monotonic() + 15
        while not recorder.hits and time.monotonic() < deadline:
            time.sleep(0.05)
        names = [job.name.rsplit("/", 1)[-1] for job in client(emulator).list_jobs(parent=PARENT)]
    assert recorder.hits, "the job that fires every second never fired"
    assert {hit.headers["X-Cloudscheduler-Jobname"] for hit in recorder.hits} == {"b-every-second"}
    assert names == ["a-never", "b-every-second"]


def test_the_stuck_jobs_report_skips_a_job_that_never_fires() -> None:
    """The dashboard's stuck page and ``runs stuck`` asked croniter for each job's last slot:
    a job that never fires raised, and the page answered 500 for every job."""
    jobs = [Job("never", NEVER), Job("daily", "0 3 * * *")]
    overdue = overdue_jobs(MemoryStore(), jobs, datetime(2026, 3, 10, 12, tzinfo=UTC))
    assert [job.name for job in overdue] == ["daily"]
