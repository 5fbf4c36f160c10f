"""Scheduled jobs whose last success is older than their schedule implies (`runs stuck`).

Reads a router's schedules in code, and over them the ``[[job]]`` tables (:mod:`tasklease.jobs`)
of a jobs file (the emulator's ``--scheduler-config``) or of the deploy config
(tasklease/deploy/tasklease.toml), of which it uses ``name``, ``schedule`` (unix-cron) and
``time_zone``; slots are :mod:`tasklease.cron`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from tasklease import cron
from tasklease.jobs import Job, load_jobs
from tasklease.worker.core.identity import parse_rfc3339
from tasklease.worker.core.queries import is_manual
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.stores.base.queries import OperatorQueries

# The deploy config `tasklease deploy --init` writes in a project: its [[job]] tables are the
# schedules `runs stuck` and the dashboard check when given none.
DEFAULT_SCHEDULES = Path("tasklease.toml")

# How long after a slot its run may still be finishing (attempts and retries) before it counts
# as missed: Cloud Scheduler's attempt deadline defaults to 3 minutes, with up to 5 retries.
DEFAULT_GRACE = timedelta(minutes=15)


@dataclass(frozen=True)
class OverdueJob:
    """A job whose slot ``due`` has passed its grace without a successful run."""

    name: str
    schedule: str
    due: datetime
    last_success: datetime | None  # The schedule time of the newest successful run.
    last_success_run_id: str | None


def default_schedules(path: Path | None) -> Path | None:
    """``path``, else ./tasklease.toml when it exists, else None."""
    if path is not None:
        return path
    return DEFAULT_SCHEDULES if DEFAULT_SCHEDULES.is_file() else None


def load_schedules(path: str | Path | None, declared: Sequence[Job] = ()) -> list[Job]:
    """The ``[[job]]`` tables of ``path`` (if any) over the ``declared`` jobs (a router's
    schedules in code: :func:`tasklease.jobs.parse_jobs`); ValueError for one that is not a
    job, or whose schedule is not unix-cron in a known time zone."""
    schedules = load_jobs(path, declared) if path is not None else list(declared)
    for job in schedules:
        try:
            cron.Cron(job.schedule, job.time_zone)
        except ValueError as exc:
            raise ValueError(f"{path}: job {job.name}: {exc}") from exc
    return schedules


def overdue_jobs(
    store: OperatorQueries,
    schedules: list[Job],
    now: datetime,
    grace: timedelta = DEFAULT_GRACE,
) -> list[OverdueJob]:
    """The jobs whose latest slot at least ``grace`` old has no successful scheduled run.

    Manual runs do not count: they carry the next slot's time, not the one that was missed.
    A job with no run on record at all is overdue too (it may also be newer than its records'
    retention, which a reader of the report can tell from ``last_success`` being empty).
    """
    overdue = []
    for schedule in schedules:
        try:
            due = cron.Cron(schedule.schedule, schedule.time_zone).last_slot(now - grace)
        except ValueError:  # croniter's CroniterBadDateError: a job that never fires (0 0 31 2 *).
            continue  # It has no slot to miss; it must not hide the others.
        success = _last_success(store.find_runs(job_name=schedule.name))
        last = None if success is None else _slot_of(success)
        if last is None or last < due:
            overdue.append(
                OverdueJob(
                    schedule.name,
                    schedule.schedule,
                    due,
                    last,
                    None if success is None else success.run_id,
                )
            )
    return overdue


def _last_success(runs: list[RunRecord]) -> RunRecord | None:
    done = [r for r in runs if r.status is RunStatus.COMPLETED and not is_manual(r)]
    return max(done, key=_slot_of, default=None)


def _slot_of(record: RunRecord) -> datetime:
    text = record.identity.get("schedule_time")
    parsed = parse_rfc3339(text) if text else None
    return parsed or record.claimed_at
