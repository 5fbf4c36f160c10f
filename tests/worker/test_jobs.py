"""The one ``[[job]]`` schema and loader: every field read with Cloud Scheduler's defaults,
and every table that is not a job refused with a message naming the job and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tasklease import jobs
from tasklease.jobs import Job, Proxy, Retry

WORKFLOW = "projects/p-123/locations/us-central1/workflows/export"


def test_every_field_of_a_table_is_read(tmp_path: Path) -> None:
    path = tmp_path / "tasklease.toml"
    path.write_text(
        'project = "p"\n[worker]\nrouter = "app:router"\n'  # Not the jobs': left alone.
        '[[job]]\nname = "nightly"\nschedule = "0 3 * * *"\ntime_zone = "Europe/Paris"\n'
        'description = "reports"\nattempt_deadline = 60\nurl = "http://127.0.0.1:8080/jobs/n"\n'
        'http_method = "PUT"\nbody = "{}"\nheaders = { "X-A" = "1" }\n'
        'service_account = "s@p.iam.gserviceaccount.com"\naudience = "http://a"\n'
        "[job.retry]\nretry_count = 3\nmax_retry_duration = 600\nmin_backoff = 1\n"
        "max_backoff = 60\nmax_doublings = 2\n"
        f'[job.proxy]\nworkflow = "{WORKFLOW}"\n'
        '[[job]]\nname = "hourly"\nschedule = "0 * * * *"\n'
    )
    nightly, hourly = jobs.load_jobs(path)
    assert nightly == Job(
        name="nightly",
        schedule="0 3 * * *",
        time_zone="Europe/Paris",
        description="reports",
        attempt_deadline=60.0,
        url="http://127.0.0.1:8080/jobs/n",
        http_method="PUT",
        body="{}",
        headers={"X-A": "1"},
        service_account="s@p.iam.gserviceaccount.com",
        audience="http://a",
        retry=Retry(3, 600.0, 1.0, 60.0, 2),
        proxy=Proxy("workflow", WORKFLOW),
    )
    assert hourly == Job("hourly", "0 * * * *")
    assert nightly.proxy is not None and nightly.proxy.name == "export"


def test_what_a_table_leaves_out_is_cloud_schedulers_default() -> None:
    """Google's REST reference: attemptDeadline 3 min for HTTP targets; RetryConfig retryCount
    0, maxRetryDuration 0 (unlimited), backoff 5 s to 1 h, maxDoublings 5; timeZone UTC."""
    job = jobs.parse_job({"name": "n", "schedule": "0 3 * * *"})
    assert (job.time_zone, job.attempt_deadline, job.url, job.proxy) == ("Etc/UTC", 180, None, None)
    assert job.retry == Retry(
        retry_count=0, max_retry_duration=0, min_backoff=5, max_backoff=3600, max_doublings=5
    )
    assert job.given() == set()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"schedule": "0 3 * * *"}, r"every \[\[job\]\] needs a name"),
        ({"name": "n"}, "job n: schedule is missing"),
        ({"name": "n", "schedule": 5}, "job n: schedule must be a non-empty string"),
        ({"name": "n", "schedule": "* * * * *", "shedule": "x"}, "job n: shedule is not a"),
        (
            {"name": "n", "schedule": "* * * * *", "retry_count": 3},
            r"job n: retry_count is not a \[\[job\]\] field \(it belongs in \[job.retry\]\)",
        ),
        ({"name": "n", "schedule": "* * * * *", "attempt_deadline": 5}, "15 to 1800 seconds"),
        ({"name": "n", "schedule": "* * * * *", "attempt_deadline": "60"}, "attempt_deadline must"),
        ({"name": "n", "schedule": "* * * * *", "retry": {"retry_count": 6}}, "retry.retry_count"),
        ({"name": "n", "schedule": "* * * * *", "retry": {"min_backoff": -1}}, "negative"),
        ({"name": "n", "schedule": "* * * * *", "retry": {"tries": 1}}, "job n: retry.tries is"),
        ({"name": "n", "schedule": "* * * * *", "retry": 3}, "job n: retry must be a table"),
        ({"name": "n", "schedule": "* * * * *", "headers": {"X": 1}}, "headers.X must be"),
        ({"name": "n", "schedule": "* * * * *", "url": ""}, "job n: url must be a non-empty"),
        ({"name": "n", "schedule": "* * * * *", "proxy": {"lambda": "x"}}, "job n: proxy must"),
    ],
)
def test_a_table_that_is_not_a_job_is_refused_naming_the_job_and_field(
    table: dict[str, Any], message: str
) -> None:
    with pytest.raises(jobs.InvalidJob, match=message):
        jobs.parse_job(table)


def test_a_job_defined_twice_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text('[[job]]\nname = "n"\nschedule = "0 3 * * *"\n' * 2)
    with pytest.raises(jobs.InvalidJob, match=f"{path}: job n: defined twice"):
        jobs.load_jobs(path)


def test_a_file_that_is_not_toml_is_refused_as_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text("[[job]\n")
    with pytest.raises(ValueError, match=str(path)):
        jobs.load_jobs(path)
