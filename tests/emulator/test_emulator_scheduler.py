"""The local Cloud Scheduler."""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from werkzeug import Response

from tasklease import jobs
from tasklease.emulator import CloudTasksEmulator, Job, RetrySettings, load_jobs
from tasklease.emulator.scheduler import emulated
from tasklease.emulator.scheduler_api import parse_job as parse_api_job
from tasklease.worker.core.identity import parse_rfc3339
from tests.support.emulator_target import Target

SA = "scheduler@p.iam.gserviceaccount.com"


def job(url: str, **changes: object) -> Job:
    fields: dict[str, object] = {"name": "nightly", "schedule": "0 3 * * *", "url": url}
    fields.update(changes)
    return Job(**fields)  # type: ignore[arg-type]


def test_manual_run_sends_the_scheduler_headers_with_the_next_scheduled_time(
    target: tuple[Target, str],
) -> None:
    recorder, url = target
    with CloudTasksEmulator(
        jobs=[job(url, service_account=SA)], scheduler_on_schedule=False
    ) as emulator:
        assert emulator.scheduler.run_job("nightly").result(timeout=10)
    [hit] = recorder.hits
    assert hit.headers["X-Cloudscheduler"] == "true"
    assert hit.headers["X-Cloudscheduler-Jobname"] == "nightly"
    when = parse_rfc3339(hit.headers["X-Cloudscheduler-Scheduletime"])
    assert when is not None and (when.hour, when.minute, when.second) == (3, 0, 0)
    assert when > datetime.now(UTC)  # gcloud's manual run uses the next time.
    assert hit.headers["Authorization"].startswith("Bearer ")


def test_a_failed_run_is_retried_with_the_same_schedule_time(target: tuple[Target, str]) -> None:
    recorder, url = target
    recorder.answer = lambda n: Response("no", status=500) if n < 3 else Response("ok")
    retry = RetrySettings(max_attempts=4, min_backoff=0.01, max_backoff=0.05, max_doublings=2)
    with CloudTasksEmulator(jobs=[job(url, retry=retry)], scheduler_on_schedule=False) as emulator:
        assert emulator.scheduler.run_job("nightly").result(timeout=10)
        deliveries = emulator.deliveries()
    assert len(recorder.hits) == 3
    assert len({h.headers["X-Cloudscheduler-Scheduletime"] for h in recorder.hits}) == 1
    assert [d.status for d in deliveries] == [500, 500, 200]


def test_retries_stop_at_the_retry_count(target: tuple[Target, str]) -> None:
    recorder, url = target
    recorder.answer = lambda n: Response("no", status=503)
    retry = RetrySettings(max_attempts=2, min_backoff=0.01, max_backoff=0.01)
    with CloudTasksEmulator(jobs=[job(url, retry=retry)], scheduler_on_schedule=False) as emulator:
        assert not emulator.scheduler.run_job("nightly").result(timeout=10)
    assert len(recorder.hits) == 2


def test_jobs_fire_on_their_cron_schedule(target: tuple[Target, str]) -> None:
    recorder, url = target
    with CloudTasksEmulator(jobs=[job(url, schedule="* * * * * */1")]) as emulator:
        time.sleep(2.5)  # croniter's sixth field is seconds: this job fires every second.
        emulator.scheduler.stop()
    times = [h.headers["X-Cloudscheduler-Scheduletime"] for h in recorder.hits]
    assert len(times) >= 2
    assert len(set(times)) == len(times)


def test_jobs_load_from_toml_with_validation(tmp_path: Path) -> None:
    config = tmp_path / "jobs.toml"
    config.write_text(
        '[[job]]\nname = "nightly"\nschedule = "0 3 * * *"\ntime_zone = "Europe/Rome"\n'
        'url = "http://127.0.0.1:8080/jobs/nightly"\n'
        'service_account = "s@p.iam.gserviceaccount.com"\n'
        "[job.retry]\nretry_count = 3\nmin_backoff = 1\n"
    )
    [loaded] = load_jobs(config)
    assert loaded.retry.max_attempts == 4
    assert loaded.next_time(datetime(2026, 7, 1, tzinfo=UTC)).hour == 1  # 03:00 CEST.


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "j", "url": "http://x"}, "missing"),
        ({"name": "j", "schedule": "* * * * *"}, "job j: url is missing"),
        ({"name": "j", "schedule": "every 5 seconds", "url": "http://x"}, "unix-cron"),
        ({"name": "j", "schedule": "0 0 31 2 *", "url": "http://x"}, "never fires"),
        (
            {"name": "j", "schedule": "* * * * *", "url": "http://x", "attempt_deadline": 5},
            "15 to 1800",
        ),
        (
            {"name": "j", "schedule": "* * * * *", "url": "http://x", "retry": {"retry_count": 9}},
            "0 to 5",
        ),
    ],
)
def test_invalid_jobs_are_refused(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        emulated(jobs.parse_job(entry))


def test_a_table_without_settings_gets_what_the_scheduler_api_fills_in() -> None:
    """tasklease.jobs states Cloud Scheduler's defaults for tasklease's files; the emulator's
    API states them as the oracle: a [[job]] table and a CreateJob left bare agree."""
    table = emulated(jobs.parse_job({"name": "j", "schedule": "0 3 * * *", "url": "http://x/"}))
    spec = parse_api_job(
        "projects/p/locations/us-central1/jobs/j",
        {"schedule": "0 3 * * *", "httpTarget": {"uri": "http://x/"}},
    )
    defaults = jobs.Job("j", "0 3 * * *")
    assert spec["timeZone"] == defaults.time_zone
    assert model_seconds(spec["attemptDeadline"]) == defaults.attempt_deadline
    retry = spec["retryConfig"]
    assert (
        int(retry["retryCount"]),
        model_seconds(retry["maxRetryDuration"]),
        model_seconds(retry["minBackoffDuration"]),
        model_seconds(retry["maxBackoffDuration"]),
        int(retry["maxDoublings"]),
    ) == dataclasses.astuple(defaults.retry)
    assert (table.retry, table.attempt_deadline) == (Job("j", "s", "u").retry, 180)


def model_seconds(text: str) -> float:
    return float(text.rstrip("s"))


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        ("every 5 minutes", "2026-03-10T12:07:30", "2026-03-10T12:12:30"),  # From the last run.
        ("every 5 minutes synchronized", "2026-03-10T12:07:30", "2026-03-10T12:10:00"),
        ("every 2 hours from 10:00 to 14:00", "2026-03-10T14:00:00", "2026-03-11T10:00:00"),
        ("every 3 hours from 22:00 to 02:00", "2026-03-10T23:00:00", "2026-03-11T01:00:00"),
        ("every monday 09:00", "2026-03-10T12:00:00", "2026-03-16T09:00:00"),
        ("2nd,third mon,wed,thu of march 17:00", "2026-03-10T12:00:00", "2026-03-11T17:00:00"),
        ("1st monday of sep,oct,nov 17:00", "2026-03-10T12:00:00", "2026-09-07T17:00:00"),
        ("1 of jan,april,july,oct 00:00", "2026-03-10T12:00:00", "2026-04-01T00:00:00"),
        ("every day 00:00", "2026-03-10T00:00:00", "2026-03-11T00:00:00"),
    ],
)
def test_english_like_schedules_fire_as_app_engine_cron_documents(
    schedule: str, after: str, expected: str
) -> None:
    job = Job(name="j", schedule=schedule, url="http://x", time_zone="utc")
    moment = datetime.fromisoformat(after).replace(tzinfo=UTC)
    assert job.next_time(moment) == datetime.fromisoformat(expected).replace(tzinfo=UTC)
    assert not job.unix_cron


@pytest.mark.parametrize(
    "schedule", ["every 0 minutes", "every 25 hours", "every funday 09:00", "31 of feb 00:00"]
)
def test_english_like_schedules_that_cannot_fire_are_refused(schedule: str) -> None:
    with pytest.raises(ValueError):
        emulated(jobs.parse_job({"name": "j", "schedule": schedule, "url": "http://x"}))
