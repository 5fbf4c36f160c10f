"""A local Cloud Scheduler: unix-cron jobs from a TOML file or the Cloud Scheduler API
(:mod:`tasklease.emulator.scheduler_api`), fired at the emulator's targets.

Each run sends ``X-CloudScheduler: true``, ``X-CloudScheduler-JobName`` and, for unix-cron
jobs only, ``X-CloudScheduler-ScheduleTime`` (RFC 3339, constant across the run's retries), plus
an OIDC token when the job names a service account. English-like schedules (``every 5
minutes``) get no schedule time, as Cloud Scheduler does not guarantee one for them.
``run_job`` triggers a job by hand as ``gcloud scheduler jobs run`` does: with the next
scheduled time. A run waiting for a retry is kept in the database
(:mod:`tasklease.emulator.pending_runs`) and resumed after a restart; one job whose schedule
cannot be computed is skipped (and logged), never stopping the others.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from tasklease import jobs
from tasklease.emulator import metrics as emulator_metrics
from tasklease.emulator import schedules
from tasklease.emulator.db import EmulatorDB
from tasklease.emulator.headers import SCHEDULER_USER_AGENT, job_headers, set_header
from tasklease.emulator.oidc import TokenIssuer
from tasklease.emulator.pending_runs import PendingRun, PendingRuns
from tasklease.emulator.policy import RetrySettings, backoff, gives_up
from tasklease.emulator.rows import DeliveryRecord
from tasklease.emulator.sender import Sender

_log = logging.getLogger("tasklease.scheduler")

# The API's limits and defaults, as the oracle spells them (docs/platform-facts.md): attempt
# deadline 15 s to 30 min, 3 min by default; no retries (at most 5), backoff 5 s to 1 h, 5
# doublings. A [[job]] table gets tasklease.jobs' (a test holds the two equal).
MIN_ATTEMPT_DEADLINE, MAX_ATTEMPT_DEADLINE = 15.0, 1800.0
DEFAULT_ATTEMPT_DEADLINE = 180.0
MAX_RETRY_COUNT = 5
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
    attempt_deadline: float = DEFAULT_ATTEMPT_DEADLINE
    retry: RetrySettings = DEFAULT_JOB_RETRY

    @functools.cached_property
    def _schedule(self) -> schedules.Schedule:
        return schedules.parse(self.schedule, self.time_zone)

    @property
    def unix_cron(self) -> bool:
        """Whether runs carry a schedule time (English-like schedules' do not)."""
        return self._schedule.unix_cron

    def next_time(self, after: datetime) -> datetime:
        """The first scheduled time strictly after ``after``, in UTC; ValueError (croniter's
        CroniterBadDateError is one) if there is none."""
        return self._schedule.next_time(after)


def load_jobs(path: Path, declared: Iterable[jobs.Job] = ()) -> list[Job]:
    """The jobs of a TOML file's ``[[job]]`` tables over the ``declared`` ones (a router's
    schedules in code: :func:`tasklease.jobs.load_jobs`)."""
    return [emulated(spec) for spec in jobs.load_jobs(path, declared)]


def emulated(spec: jobs.Job) -> Job:
    """The emulator's job for a ``[[job]]`` table: it needs the ``url`` to call, and may have
    an English-like schedule; ValueError naming the job otherwise."""
    if spec.url is None:
        raise jobs.InvalidJob(f"job {spec.name}: url is missing (the target the emulator calls)")
    try:
        schedules.check(spec.schedule, spec.time_zone, datetime.now(UTC))
    except ValueError as exc:
        raise jobs.InvalidJob(f"job {spec.name}: {exc}") from exc
    retry = spec.retry
    return Job(
        name=spec.name,
        schedule=spec.schedule,
        url=spec.url,
        time_zone=spec.time_zone,
        http_method=spec.http_method,
        body=spec.body.encode(),
        headers=dict(spec.headers),
        service_account=spec.service_account,
        audience=spec.audience,
        attempt_deadline=spec.attempt_deadline,
        retry=RetrySettings(
            max_attempts=retry.retry_count + 1,
            max_retry_duration=retry.max_retry_duration,
            min_backoff=retry.min_backoff,
            max_backoff=retry.max_backoff,
            max_doublings=retry.max_doublings,
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
        self._pending = PendingRuns(db)
        self.after_run: Callable[[str, int, int | None], None] | None = None

    def start(self) -> None:
        """Resume the runs that were waiting for a retry, and fire jobs on schedule."""
        self._resume()
        if self._on_schedule:
            self._thread.start()

    def _resume(self) -> None:
        for pending in self._pending.all():
            with self._jobs_lock:
                job = self.jobs.get(pending.job)
            if job is None:  # Deleted or paused since: nothing more is owed.
                _log.info("dropping the retry of %s: the job is gone or paused", pending.job)
                self._pending.done(pending.run_id)
                continue
            when = datetime.fromtimestamp(pending.schedule_us / 1e6, UTC)
            future = self._pool.submit(self._run, job, when, pending)
            self._runs.append(future)

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
        broken: dict[str, Job] = {}  # Jobs with no next time: logged once, until changed.
        while not self._stopping.is_set():
            self._changed.clear()
            now = datetime.now(UTC)
            with self._jobs_lock:
                current = dict(self.jobs)
            # A new or changed job is scheduled from now; a removed one is forgotten.
            scheduled: dict[str, tuple[Job, datetime]] = {}
            for name, job in current.items():
                if name in next_fire and next_fire[name][0] == job:
                    scheduled[name] = next_fire[name]
                elif broken.get(name) != job and (when := self._next(job, now)) is not None:
                    scheduled[name] = (job, when)
                else:
                    broken[name] = job
            next_fire = scheduled
            for name, (job, when) in list(next_fire.items()):
                if when <= now:
                    self.run(job, when)
                    following = self._next(job, when)
                    if following is None:
                        del next_fire[name]
                        broken[name] = job
                    else:
                        next_fire[name] = (job, following)
            soonest = min((when for _, when in next_fire.values()), default=None)
            wait = 1.0 if soonest is None else (soonest - now).total_seconds()
            self._changed.wait(max(0.05, min(1.0, wait)))

    @staticmethod
    def _next(job: Job, after: datetime) -> datetime | None:
        """``job``'s next time, or None (logged) if it has none: that job is skipped."""
        try:
            return job.next_time(after)
        except Exception:
            _log.exception("scheduler job %s has no next run; skipping it", job.name)
            return None

    def _run(self, job: Job, schedule_time: datetime, resumed: PendingRun | None = None) -> bool:
        """One scheduled run with its retries; True if the target answered 2xx. A run owed
        a retry is kept in the database while it waits, and left there if the scheduler
        stops meanwhile (``resumed``: such a run, after a restart)."""
        stamp = schedule_time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        run_id = resumed.run_id if resumed else uuid.uuid4().hex
        first_us = resumed.first_us if resumed else _now_us()
        attempt = resumed.attempt if resumed else 0
        if resumed is not None and self._stopping.wait(
            max(0.0, resumed.next_us / 1e6 - time.time())
        ):
            return False
        while True:
            attempt += 1
            # What Cloud Scheduler ignores or sets is not the job's to send (emulator.headers).
            headers = job_headers(job.headers, job.body)
            headers["User-Agent"] = SCHEDULER_USER_AGENT
            headers["X-CloudScheduler"] = "true"
            headers["X-CloudScheduler-JobName"] = job.name.rsplit("/", 1)[-1]
            if job.unix_cron:
                headers["X-CloudScheduler-ScheduleTime"] = stamp
            if job.service_account:
                token = self._issuer.mint(job.service_account, job.audience or job.url)
                set_header(headers, "Authorization", f"Bearer {token}")
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
                self._pending.done(run_id)
                self._after_run(job, result.started_us, result.status)
                return True
            if gives_up(job.retry, attempt, (_now_us() - first_us) / 1e6):
                _log.warning(
                    "scheduler job %s run %s failed after %d attempts", job.name, stamp, attempt
                )
                self._pending.done(run_id)
                self._after_run(job, result.started_us, result.status)
                return False
            delay = backoff(job.retry, attempt)
            self._pending.owe(
                PendingRun(
                    run_id, job.name, scheduled_us, attempt, first_us, _now_us() + int(delay * 1e6)
                )
            )
            if self._stopping.wait(delay):
                return False  # Still owed: the next start resumes it at its time.

    def _after_run(self, job: Job, attempt_us: int, status: int | None) -> None:
        if self.after_run is not None:
            try:
                self.after_run(job.name, attempt_us, status)
            except Exception:
                _log.exception("recording the run of %s failed", job.name)


def _now_us() -> int:
    return time.time_ns() // 1000
