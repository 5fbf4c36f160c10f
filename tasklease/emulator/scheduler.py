"""A local Cloud Scheduler: unix-cron jobs from a TOML file or the Cloud Scheduler API
(:mod:`tasklease.emulator.scheduler_api`), fired at the emulator's targets.

Each run sends ``X-CloudScheduler: true``, ``X-CloudScheduler-JobName`` and
``X-CloudScheduler-ScheduleTime`` (RFC 3339, constant across the run's retries), plus an OIDC
token when the job names a service account. ``run_job`` triggers a job by hand as
``gcloud scheduler jobs run`` does: with the next scheduled time.
"""

from __future__ import annotations

import logging
import threading
import time
import tomllib
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from tasklease.emulator import metrics as emulator_metrics
from tasklease.emulator.db import DeliveryRecord, EmulatorDB
from tasklease.emulator.oidc import TokenIssuer
from tasklease.emulator.policy import RetrySettings, backoff, gives_up
from tasklease.emulator.sender import Sender

_log = logging.getLogger("tasklease.scheduler")

# Cloud Scheduler limits (platform-facts.md): attempt deadline 15 s to 30 min, retries <= 5.
MIN_ATTEMPT_DEADLINE, MAX_ATTEMPT_DEADLINE = 15.0, 1800.0
MAX_RETRY_COUNT = 5
# Cloud Scheduler's retry defaults: no retries; backoff 5 s to 1 h, 5 doublings.
DEFAULT_JOB_RETRY = RetrySettings(max_attempts=1, min_backoff=5, max_backoff=3600, max_doublings=5)


@dataclass(frozen=True)
class Job:
    """One Cloud Scheduler job with an HTTP target. ``name`` is the job ID, or the full
    resource name (``projects/P/locations/L/jobs/ID``) for jobs made through the API."""

    name: str
    schedule: str
    url: str
    time_zone: str = "UTC"
    http_method: str = "POST"
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    service_account: str | None = None
    audience: str | None = None
    attempt_deadline: float = 180.0
    retry: RetrySettings = DEFAULT_JOB_RETRY

    def next_time(self, after: datetime) -> datetime:
        """The first scheduled time strictly after ``after``, in UTC."""
        local = after.astimezone(ZoneInfo(self.time_zone))
        following: datetime = croniter(self.schedule, local).get_next(datetime)
        return following.astimezone(UTC)


def load_jobs(path: Path) -> list[Job]:
    """Jobs from a TOML file of ``[[job]]`` tables (see deploy/tasklease.toml)."""
    with path.open("rb") as handle:
        document = tomllib.load(handle)
    return [parse_job(entry) for entry in document.get("job", [])]


def parse_job(entry: dict[str, Any]) -> Job:
    """Validate one ``[[job]]`` table."""
    missing = {"name", "schedule", "url"} - entry.keys()
    if missing:
        raise ValueError(f"scheduler job {entry.get('name', '?')}: missing {sorted(missing)}")
    if not croniter.is_valid(entry["schedule"]):
        raise ValueError(f"job {entry['name']}: {entry['schedule']!r} is not a unix-cron schedule")
    deadline = float(entry.get("attempt_deadline", 180))
    if not MIN_ATTEMPT_DEADLINE <= deadline <= MAX_ATTEMPT_DEADLINE:
        raise ValueError(f"job {entry['name']}: attempt_deadline must be 15 to 1800 seconds")
    retry = entry.get("retry", {})
    retry_count = int(retry.get("retry_count", 0))
    if not 0 <= retry_count <= MAX_RETRY_COUNT:
        raise ValueError(f"job {entry['name']}: retry_count must be 0 to {MAX_RETRY_COUNT}")
    ZoneInfo(entry.get("time_zone", "UTC"))  # Raises for an unknown zone.
    return Job(
        name=entry["name"],
        schedule=entry["schedule"],
        url=entry["url"],
        time_zone=entry.get("time_zone", "UTC"),
        http_method=entry.get("http_method", "POST"),
        body=str(entry.get("body", "")).encode(),
        headers=dict(entry.get("headers", {})),
        service_account=entry.get("service_account"),
        audience=entry.get("audience"),
        attempt_deadline=deadline,
        retry=RetrySettings(
            max_attempts=retry_count + 1,
            max_retry_duration=float(retry.get("max_retry_duration", 0)),
            min_backoff=float(retry.get("min_backoff", 5)),
            max_backoff=float(retry.get("max_backoff", 3600)),
            max_doublings=int(retry.get("max_doublings", 5)),
        ),
    )


class LocalScheduler:
    """Fires jobs on their schedules (if ``on_schedule``) and on demand. Jobs can be added,
    replaced and removed while it runs; ``after_run(name, attempt_us, status)`` is called
    after each run's last attempt."""

    def __init__(
        self,
        jobs: Iterable[Job],
        db: EmulatorDB,
        issuer: TokenIssuer,
        sender: Sender,
        *,
        on_schedule: bool = True,
    ) -> None:
        self.jobs = {job.name: job for job in jobs}
        self._db = db
        self._issuer = issuer
        self._sender = sender
        self._on_schedule = on_schedule
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="emulator-scheduler")
        self._runs: list[Future[bool]] = []
        self._stopping = threading.Event()
        self._changed = threading.Event()
        self._jobs_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="emulator-cron", daemon=True)
        self.after_run: Callable[[str, int, int | None], None] | None = None

    def start(self) -> None:
        if self._on_schedule:
            self._thread.start()

    def add(self, job: Job) -> None:
        """Schedule ``job`` (replacing a job of that name) from now on."""
        with self._jobs_lock:
            self.jobs[job.name] = job
        self._changed.set()

    def remove(self, name: str) -> None:
        with self._jobs_lock:
            self.jobs.pop(name, None)
        self._changed.set()

    def stop(self) -> None:
        self._stopping.set()
        self._changed.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def run_job(self, name: str, schedule_time: datetime | None = None) -> Future[bool]:
        """Trigger ``name`` now, for ``schedule_time`` (default: its next scheduled time)."""
        job = self.jobs.get(name)
        if job is None:
            raise KeyError(f"no scheduler job {name!r}")
        return self.run(job, schedule_time)

    def run(self, job: Job, schedule_time: datetime | None = None) -> Future[bool]:
        """Trigger ``job``, scheduled or not (a manual run of a paused job)."""
        when = schedule_time or job.next_time(datetime.now(UTC))
        future = self._pool.submit(self._run, job, when)
        self._runs.append(future)
        return future

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every run started so far has finished (retries included)."""
        _, pending = wait(list(self._runs), timeout=timeout)
        return not pending

    def _loop(self) -> None:
        next_fire: dict[str, tuple[Job, datetime]] = {}
        while not self._stopping.is_set():
            self._changed.clear()
            now = datetime.now(UTC)
            with self._jobs_lock:
                current = dict(self.jobs)
            # A new or changed job is scheduled from now; a removed one is forgotten.
            next_fire = {
                name: next_fire[name]
                if name in next_fire and next_fire[name][0] == job
                else (job, job.next_time(now))
                for name, job in current.items()
            }
            for name, (job, when) in list(next_fire.items()):
                if when <= now:
                    self.run(job, when)
                    next_fire[name] = (job, job.next_time(when))
            soonest = min((when for _, when in next_fire.values()), default=None)
            wait = 1.0 if soonest is None else (soonest - now).total_seconds()
            self._changed.wait(max(0.05, min(1.0, wait)))

    def _run(self, job: Job, schedule_time: datetime) -> bool:
        """One scheduled run with its retries; True if the target answered 2xx."""
        stamp = schedule_time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        first = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            headers = {
                **job.headers,
                "User-Agent": "Google-Cloud-Scheduler",
                "X-CloudScheduler": "true",
                "X-CloudScheduler-JobName": job.name.rsplit("/", 1)[-1],
                "X-CloudScheduler-ScheduleTime": stamp,
            }
            if job.service_account:
                token = self._issuer.mint(job.service_account, job.audience or job.url)
                headers["Authorization"] = f"Bearer {token}"
            result, duplicate = self._sender.send(
                job.http_method, job.url, headers, job.body, job.attempt_deadline
            )
            scheduled_us = int(schedule_time.timestamp() * 1_000_000)
            short_name = job.name.rsplit("/", 1)[-1]  # API jobs have a full resource name.
            emulator_metrics.attempted(f"scheduler/{short_name}", scheduled_us, result)
            for sent in filter(None, [result, duplicate]):
                self._db.log_delivery(
                    DeliveryRecord.of(
                        "scheduler",
                        None,
                        f"{job.name}@{stamp}",
                        job.url,
                        attempt=attempt,
                        sent=sent,
                    )
                )
            if result.succeeded:
                self._after_run(job, result.started_us, result.status)
                return True
            if gives_up(job.retry, attempt, time.monotonic() - first) or self._stopping.is_set():
                _log.warning(
                    "scheduler job %s run %s failed after %d attempts", job.name, stamp, attempt
                )
                self._after_run(job, result.started_us, result.status)
                return False
            self._stopping.wait(backoff(job.retry, attempt))

    def _after_run(self, job: Job, attempt_us: int, status: int | None) -> None:
        if self.after_run is not None:
            try:
                self.after_run(job.name, attempt_us, status)
            except Exception:
                _log.exception("recording the run of %s failed", job.name)
