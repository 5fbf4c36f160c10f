"""Schedules in code: the Cloud Scheduler job a ``@router.scheduled(..., schedule=...)``
handler declares, checked when the handler is registered, and the jobs of a router.

The job is one of :mod:`tasklease.jobs`' schema, so every consumer of ``[[job]]`` tables (the
deploy kit, ``tasklease dev``, the pytest plugin's scheduler, ``tasklease runs stuck``) takes
the router's jobs the same way, a TOML file's tables over them (:func:`tasklease.jobs.parse_jobs`
states the precedence).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from tasklease import jobs
from tasklease.errors import ConfigurationError
from tasklease.worker.core.identity import Kind
from tasklease.worker.handlers.spec import HandlerSpec, JobRetry

# JobRetry is defined with the handler's other options; importable from here as it was.
__all__ = ["JobRetry", "check_schedule", "declared_job", "declared_jobs", "router_jobs"]


# The TOML name of each JobRetry field, for messages in the code's own terms.
_RETRY_NAMES = {
    "min_backoff": "min_backoff_duration",
    "max_backoff": "max_backoff_duration",
}


def check_schedule(spec: HandlerSpec) -> None:
    """Refuse (ConfigurationError naming the handler) a schedule Cloud Scheduler would not
    take: not unix-cron of five fields (so runs carry a ScheduleTime), an unknown time zone,
    one that never fires, a retry config or attempt deadline out of Google's limits, or job
    options without a schedule."""
    where = f"scheduled handler {spec.name!r}"
    if spec.schedule is None:
        given = [
            option
            for option, value in (
                ("time_zone", spec.time_zone),
                ("retry", spec.retry),
                ("description", spec.description or None),
                ("attempt_deadline", spec.attempt_deadline),
            )
            if value is not None
        ]
        if given:
            raise ConfigurationError(f"{where}: {', '.join(given)} apply only with schedule=")
        return
    if spec.kind is not Kind.SCHEDULER:
        raise ConfigurationError(f"{where}: only scheduled handlers have a schedule")
    if not isinstance(spec.schedule, str) or len(spec.schedule.split()) != 5:
        raise ConfigurationError(
            f"{where}: schedule {spec.schedule!r} is not unix-cron of 5 fields "
            "(minute hour day-of-month month day-of-week)"
        )
    from tasklease import cron  # noqa: PLC0415 - croniter, only for routers with schedules.

    try:
        cron.check(spec.schedule, spec.time_zone or jobs.DEFAULT_TIME_ZONE, datetime.now(UTC))
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    if not isinstance(spec.description, str):
        raise ConfigurationError(f"{where}: description must be a string")
    if spec.retry is not None:
        _check_retry_types(where, spec.retry)
        if problems := jobs.retry_problems(spec.retry.as_retry()):
            name, why = problems[0]
            raise ConfigurationError(f"{where}: retry.{_RETRY_NAMES.get(name, name)} {why}")
    if spec.attempt_deadline is not None:
        low, high = jobs.MIN_ATTEMPT_DEADLINE, jobs.MAX_ATTEMPT_DEADLINE
        if not isinstance(spec.attempt_deadline, timedelta):
            raise ConfigurationError(f"{where}: attempt_deadline must be a timedelta")
        if not low <= spec.attempt_deadline.total_seconds() <= high:
            raise ConfigurationError(
                f"{where}: attempt_deadline must be {low:g} to {high:g} seconds"
            )


def _check_retry_types(where: str, retry: Any) -> None:
    if not isinstance(retry, JobRetry):
        raise ConfigurationError(f"{where}: retry must be a JobRetry, not {retry!r}")
    for name in ("retry_count", "max_doublings"):
        value = getattr(retry, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigurationError(f"{where}: retry.{name} must be a whole number")
    for name in ("max_retry_duration", "min_backoff_duration", "max_backoff_duration"):
        if not isinstance(getattr(retry, name), timedelta):
            raise ConfigurationError(f"{where}: retry.{name} must be a timedelta")


def declared_job(spec: HandlerSpec) -> jobs.Job | None:
    """The job ``spec`` declares, or None when it has no schedule in code."""
    if spec.kind is not Kind.SCHEDULER or spec.schedule is None:
        return None
    options: dict[str, Any] = {}
    if spec.attempt_deadline is not None:
        options["attempt_deadline"] = spec.attempt_deadline.total_seconds()
    return jobs.Job(
        name=spec.name,
        schedule=spec.schedule,
        time_zone=spec.time_zone or jobs.DEFAULT_TIME_ZONE,
        description=spec.description,
        retry=(spec.retry or JobRetry()).as_retry(),
        **options,
    )


def declared_jobs(handlers: Iterable[HandlerSpec]) -> list[jobs.Job]:
    """The jobs a router's handlers declare (``declared_jobs(router)``), in their order."""
    return [job for spec in handlers if (job := declared_job(spec)) is not None]


def router_jobs(
    handlers: Iterable[HandlerSpec], tables: Any = (), source: str = ""
) -> list[jobs.Job]:
    """The router's jobs with the ``[[job]]`` ``tables`` of ``source`` over them, and the
    tables' other jobs (the precedence of :func:`tasklease.jobs.parse_jobs`)."""
    return jobs.parse_jobs(list(tables), source=source, declared=declared_jobs(handlers))
