"""Schedules in code: ``@router.scheduled(..., schedule=...)`` declares the handler's Cloud
Scheduler job, checked at import; a ``[[job]]`` table of the same name overrides its fields."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tasklease import JobRetry, Router
from tasklease.errors import ConfigurationError
from tasklease.jobs import InvalidJob, Job, Retry, load_jobs, parse_jobs
from tasklease.testing.stubs import StubScheduler
from tasklease.worker import TaskContext, create_app
from tasklease.worker.handlers.declared_jobs import declared_jobs, router_jobs
from tasklease.worker.stores import MemoryStore

pytest_plugins = ["pytester"]

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def nightly(ctx: TaskContext) -> None:
    """A scheduled handler."""


def scheduled_router() -> Router:
    router = Router()
    router.scheduled(
        "nightly_reports",
        schedule="0 3 * * *",
        time_zone="Europe/Paris",
        retry=JobRetry(retry_count=3, min_backoff_duration=timedelta(seconds=30)),
        description="the nightly reports",
        attempt_deadline=timedelta(minutes=10),
    )(nightly)
    router.scheduled("unscheduled")(nightly)
    return router


def test_a_scheduled_handler_declares_its_job_in_the_one_schema() -> None:
    [job] = declared_jobs(scheduled_router())
    assert job == Job(
        name="nightly_reports",
        schedule="0 3 * * *",
        time_zone="Europe/Paris",
        description="the nightly reports",
        attempt_deadline=600.0,
        retry=Retry(retry_count=3, min_backoff=30.0),
    )


def test_a_schedule_without_a_time_zone_or_retry_gets_cloud_schedulers_defaults() -> None:
    router = Router()
    router.scheduled("hourly", schedule="0 * * * *")(nightly)
    assert declared_jobs(router) == [Job("hourly", "0 * * * *")]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"schedule": "0 3 * *"}, "not unix-cron of 5 fields"),
        ({"schedule": "every 5 minutes"}, "not unix-cron of 5 fields"),
        ({"schedule": "0 25 * * *"}, "not a unix-cron schedule"),
        ({"schedule": "0 3 * * *", "time_zone": "Europe/Pariss"}, "Invalid time zone"),
        ({"schedule": "0 0 31 2 *"}, "never fires"),
        ({"schedule": "0 3 * * *", "retry": JobRetry(retry_count=6)}, "retry_count must be 0"),
        (
            {"schedule": "0 3 * * *", "retry": JobRetry(min_backoff_duration=timedelta(-1))},
            r"retry\.min_backoff_duration must not be negative",
        ),
        ({"schedule": "0 3 * * *", "retry": Retry()}, "retry must be a JobRetry"),
        (
            {"schedule": "0 3 * * *", "retry": JobRetry(retry_count=1.5)},  # type: ignore[arg-type]
            r"retry\.retry_count must be a whole number",
        ),
        (
            {"schedule": "0 3 * * *", "retry": JobRetry(max_backoff_duration=60)},  # type: ignore[arg-type]
            r"retry\.max_backoff_duration must be a timedelta",
        ),
        ({"schedule": "0 3 * * *", "description": 7}, "description must be a string"),
        ({"schedule": "0 3 * * *", "attempt_deadline": 60}, "attempt_deadline must be a timedelta"),
        (
            {"schedule": "0 3 * * *", "attempt_deadline": timedelta(seconds=10)},
            "attempt_deadline must be 15 to 1800",
        ),
        ({"time_zone": "Europe/Paris"}, "apply only with schedule="),
        ({"retry": JobRetry()}, "apply only with schedule="),
    ],
)
def test_a_job_cloud_scheduler_would_refuse_is_a_configuration_error_naming_the_handler(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as refused:
        Router().scheduled("nightly_reports", **options)(nightly)  # type: ignore[arg-type]
    assert "'nightly_reports'" in str(refused.value)


def test_a_table_of_the_same_name_overrides_only_the_fields_it_sets() -> None:
    tables = [{"name": "nightly_reports", "time_zone": "Etc/UTC", "retry": {"retry_count": 1}}]
    [job] = router_jobs(scheduled_router(), tables)
    assert job.schedule == "0 3 * * *"  # The code's: the table leaves it out.
    assert job.time_zone == "Etc/UTC"  # The table's, though it is the default.
    assert job.retry == Retry(retry_count=1, min_backoff=30.0)  # Key by key.
    assert (job.description, job.attempt_deadline) == ("the nightly reports", 600.0)


def test_a_table_for_a_handler_with_no_schedule_in_code_is_its_job_as_before() -> None:
    tables = [{"name": "unscheduled", "schedule": "*/5 * * * *"}]
    jobs = router_jobs(scheduled_router(), tables)
    assert [(j.name, j.schedule) for j in jobs] == [
        ("nightly_reports", "0 3 * * *"),
        ("unscheduled", "*/5 * * * *"),
    ]


def test_a_table_without_schedule_for_no_declared_job_is_refused() -> None:
    with pytest.raises(InvalidJob, match="job unscheduled: schedule is missing"):
        router_jobs(scheduled_router(), [{"name": "unscheduled", "time_zone": "Etc/UTC"}])


def test_an_override_is_checked_as_any_table_is() -> None:
    with pytest.raises(InvalidJob, match=r"retry\.retry_count must be 0 to 5"):
        router_jobs(scheduled_router(), [{"name": "nightly_reports", "retry": {"retry_count": 9}}])
    with pytest.raises(InvalidJob, match="defined twice"):
        router_jobs(scheduled_router(), [{"name": "nightly_reports"}] * 2)


def test_the_file_loader_takes_the_declared_jobs_too(tmp_path: Path) -> None:
    path = tmp_path / "tasklease.toml"
    path.write_text('[[job]]\nname = "nightly_reports"\nschedule = "30 4 * * *"\n')
    [job] = load_jobs(path, declared=declared_jobs(scheduled_router()))
    assert (job.schedule, job.time_zone) == ("30 4 * * *", "Europe/Paris")
    assert parse_jobs([], declared=[job]) == [job]


def test_the_stub_scheduler_fires_a_job_declared_in_code_after_bind(tmp_path: Path) -> None:
    router = scheduled_router()
    ran: list[datetime | None] = []
    router.scheduled("paris_morning", schedule="0 9 * * *", time_zone="Europe/Paris")(
        lambda ctx: ran.append(ctx.schedule_time)
    )
    config = tmp_path / "tasklease.toml"
    config.write_text('[[job]]\nname = "paris_morning"\ntime_zone = "Asia/Tokyo"\n')
    scheduler = StubScheduler()
    scheduler.load(config)  # An override only: it waits for the code's job.
    assert "paris_morning" not in scheduler.jobs
    scheduler.bind(router)
    client = create_app(router, store=MemoryStore(), auth="none", clock=lambda: NOW).test_client()
    # 09:00 in Tokyo (the override's zone) is 00:00 UTC; in Paris (the code's) 08:00 UTC.
    with pytest.raises(ValueError, match="not a slot of job paris_morning"):
        scheduler.fire(client, "paris_morning", at=datetime(2026, 3, 1, 8, tzinfo=UTC))
    delivered = scheduler.fire(client, "paris_morning", at=datetime(2026, 3, 1, tzinfo=UTC))
    assert delivered.outcome == "processed"
    assert ran == [datetime(2026, 3, 1, 0, 0, tzinfo=UTC)]
    assert scheduler.jobs["nightly_reports"].time_zone == "Europe/Paris"


def test_the_stub_scheduler_checks_an_override_table_when_it_loads_it(tmp_path: Path) -> None:
    config = tmp_path / "tasklease.toml"
    config.write_text('[[job]]\nname = "nightly_reports"\nattempt_deadline = 5\n')
    with pytest.raises(InvalidJob, match="attempt_deadline must be 15 to 1800"):
        StubScheduler().load(config)


def test_the_plugins_scheduler_fires_a_job_in_code_its_toml_overrides(
    pytester: pytest.Pytester,
) -> None:
    pytester.makefile(".toml", tasklease='[[job]]\nname = "digest"\ntime_zone = "Asia/Tokyo"\n')
    pytester.makepyfile(
        """
        from datetime import UTC, datetime

        from tasklease import Router
        from tasklease.worker import create_app
        from tasklease.worker.stores import MemoryStore

        router = Router()
        router.scheduled("digest", schedule="0 9 * * *", time_zone="Europe/Paris")(
            lambda ctx: None
        )

        def test_fire(tasklease_scheduler):
            tasklease_scheduler.bind(router)
            app = create_app(router, store=MemoryStore(), auth="none",
                             clock=lambda: datetime(2026, 3, 1, 0, 0, 5, tzinfo=UTC))
            slot = datetime(2026, 3, 1, 0, 0, tzinfo=UTC)  # 09:00 in Tokyo
            fired = tasklease_scheduler.fire(app.test_client(), "digest", at=slot)
            assert fired.outcome == "processed"
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
