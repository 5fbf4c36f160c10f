"""The deploy kit's configuration (its ``tasklease.toml``): its model, loading, and the checks
that refuse a file that cannot work before any gcloud call."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasklease.deploy.errors import DeployError
from tasklease.deploy.regions import REGIONS
from tasklease.deploy.stores import (
    STORE_FORMATS,
    Postgres,
    Spanner,
    load_postgres,
    load_spanner,
    store_values,
)
from tasklease.jobs import PROXY_KINDS, Job, parse_jobs

DEFAULT_CONFIG = Path(__file__).with_name("tasklease.toml")
# What each setting's target accepts (Google's documented formats, or narrower). Every value
# reaches gcloud's command line, and the router and store settings reach --set-env-vars, so a
# "|" or "," there would add environment variables of the writer's choice.
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
NAME_FORMATS: dict[str, tuple[str, str]] = {
    "project": (r"(?:[a-z][a-z0-9.-]{0,62}:)?[a-z][a-z0-9-]{4,28}[a-z0-9]", "a project ID"),
    "region": (r"[a-z]+(?:-[a-z]+)+[0-9]{1,2}", "a region such as us-central1"),
    "worker.service": (r"[a-z](?:[a-z0-9-]{0,47}[a-z0-9])?", "a Cloud Run service name"),
    "worker.router": (rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})*:{_IDENTIFIER}", "module:attribute"),
    "firestore.database": (r"\(default\)|[a-z][a-z0-9-]{2,61}[a-z0-9]", "a database ID"),
    "firestore.location": (r"[a-z][a-z0-9-]{1,62}", "a Firestore location"),
    "firestore.collection": (r"[A-Za-z0-9_-]{1,100}", "letters, digits, _ and -"),
    "accounts.worker": (r"[a-z][a-z0-9-]{4,28}[a-z0-9]", "a service account ID"),
    "accounts.invoker": (r"[a-z][a-z0-9-]{4,28}[a-z0-9]", "a service account ID"),
    "accounts.enqueuers": (
        r"(?:user|serviceAccount|group):[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+|domain:[a-z0-9.-]+",
        "an IAM member such as serviceAccount:NAME@PROJECT.iam.gserviceaccount.com",
    ),
    # Positional arguments of gcloud: never starting with "-", which would make them flags.
    "queue.name": (r"[A-Za-z0-9][A-Za-z0-9-]{0,99}", "a queue ID: letters, digits and -"),
    "job.name": (r"[A-Za-z0-9][A-Za-z0-9_-]{0,499}", "a job ID: letters, digits, _ and -"),
    "job.schedule": (r"[A-Za-z0-9*/,-]+(?: [A-Za-z0-9*/,-]+){4}", "unix-cron"),
    "job.time_zone": (r"[A-Za-z][A-Za-z0-9_+-]*(?:/[A-Za-z0-9_+-]+){0,2}", "a tz name"),
    **STORE_FORMATS,
}


@dataclass(frozen=True)
class Queue:
    name: str
    dispatch_deadline: float = 600
    max_attempts: int = 100
    max_retry_duration: float = 0
    min_backoff: float = 0.1
    max_backoff: float = 3600
    max_doublings: int = 16
    max_dispatches_per_second: float = 500
    max_concurrent_dispatches: int = 1000


# What a [[job]] table may say that a deploy does not apply: its target is the worker's
# /jobs/<name>, called with the invoker's OIDC token, and gcloud is not given the rest.
NOT_DEPLOYED = {"url", "http_method", "body", "headers", "service_account", "audience"}


SERVERS = ("gunicorn", "uvicorn")  # What the generated Procfile runs (worker.server).


@dataclass(frozen=True)
class Config:
    project: str
    region: str
    service: str
    router: str
    request_timeout: float
    lease: float
    retention_days: float
    workers: int
    threads: int
    gunicorn_timeout: float
    min_instances: int
    max_instances: int
    fan_out: bool
    database: str
    firestore_location: str
    collection: str
    worker_account: str
    invoker_account: str
    enqueuers: tuple[str, ...]
    queues: tuple[Queue, ...]
    jobs: tuple[Job, ...] = field(default_factory=tuple)
    allow_unlisted_region: bool = False  # A region Google added after tasklease.deploy.regions.
    server: str = "gunicorn"  # Or "uvicorn": the Procfile serves tasklease.worker.asgi.
    store: str = "firestore"  # Where the worker keeps its runs (tasklease.deploy.stores).
    postgresql: Postgres | None = None
    spanner: Spanner | None = None

    @property
    def store_url(self) -> str:
        """TASKLEASE_STORE of the deployed worker."""
        if self.store == "postgresql" and self.postgresql is not None:
            return self.postgresql.url
        if self.store == "spanner" and self.spanner is not None:
            return self.spanner.url(self.project)
        return f"firestore://?collection={self.collection}&database={self.database}"

    @property
    def lock_collection(self) -> str:
        """Where the Firestore store keeps locks (FirestoreStore.lock_collection)."""
        return f"{self.collection}_locks"

    @property
    def tally_collection(self) -> str:
        """Where the Firestore store keeps delivery counts (stores.firestore_tally)."""
        return f"{self.collection}_tally"

    @property
    def fan_in_collections(self) -> tuple[str, str, str]:
        """The collection groups of the Firestore store's joins: roots, shards, entries
        (stores.firestore.fan_ins)."""
        return (
            f"{self.collection}_fan_ins",
            f"{self.collection}_fan_in_shards",
            f"{self.collection}_fan_in_entries",
        )

    @property
    def worker_email(self) -> str:
        return f"{self.worker_account}@{self.project}.iam.gserviceaccount.com"

    @property
    def invoker_email(self) -> str:
        return f"{self.invoker_account}@{self.project}.iam.gserviceaccount.com"


def load_config(path: Path, declared: Sequence[Job] = ()) -> Config:
    """Read and check the TOML file; raise DeployError listing every problem. ``declared``
    are the jobs the router declares in code: the file's [[job]] tables override them
    (tasklease.jobs.parse_jobs)."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DeployError(f"cannot read {path}: {exc}") from exc
    worker, firestore, accounts = (
        raw.get("worker", {}),
        raw.get("firestore", {}),
        raw.get("accounts", {}),
    )
    try:
        config = Config(
            project=raw["project"],
            region=raw["region"],
            service=worker.get("service", "tasklease-worker"),
            router=worker["router"],
            request_timeout=float(worker.get("request_timeout", 900)),
            lease=float(worker.get("lease", 300)),
            retention_days=float(worker.get("retention_days", 7)),
            workers=int(worker.get("workers", 2)),
            threads=int(worker.get("threads", 8)),
            gunicorn_timeout=float(worker.get("gunicorn_timeout", 0)),
            min_instances=int(worker.get("min_instances", 0)),
            max_instances=int(worker.get("max_instances", 10)),
            fan_out=bool(worker.get("fan_out", True)),
            database=firestore.get("database", "(default)"),
            firestore_location=firestore.get("location", raw["region"]),
            collection=firestore.get("collection", "tasklease_runs"),
            worker_account=accounts.get("worker", "tasklease-worker"),
            invoker_account=accounts.get("invoker", "tasklease-invoker"),
            enqueuers=tuple(accounts.get("enqueuers", [])),
            queues=tuple(Queue(**queue) for queue in raw.get("queue", [])),
            jobs=deployed_jobs(raw.get("job", []), declared),
            allow_unlisted_region=raw.get("allow_unlisted_region", False) is True,
            server=worker.get("server", "gunicorn"),
            store=raw.get("store", "firestore"),
            postgresql=load_postgres(raw.get("postgresql")),
            spanner=load_spanner(raw.get("spanner")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DeployError(f"{path}: missing or invalid setting: {exc}") from exc
    problems = check_names(config) or check_proxies(config) or check(config)
    if problems:
        raise DeployError(f"{path} is inconsistent:\n" + "\n".join(f"  - {p}" for p in problems))
    return config


def deployed_jobs(tables: Any, declared: Sequence[Job] = ()) -> tuple[Job, ...]:
    """The ``[[job]]`` tables (tasklease.jobs) over the ``declared`` jobs, refusing a field
    the deploy would not apply."""
    jobs = tuple(parse_jobs(tables, declared=declared))
    for job in jobs:
        if ignored := sorted(job.given() & NOT_DEPLOYED):
            raise ValueError(
                f"job {job.name}: {', '.join(ignored)}: not applied by a deploy, whose job "
                "calls the worker's /jobs/<name> with the invoker's token"
            )
    return jobs


def check_names(config: Config) -> list[str]:
    """Every name, ID and reference in the character set its target accepts, so nothing in
    the file can add a flag or an environment variable to a gcloud call."""
    problems, store_fields = store_values(config.store, config.postgresql, config.spanner)
    values: list[tuple[str, Any]] = [
        *store_fields,
        ("project", config.project),
        ("region", config.region),
        ("worker.service", config.service),
        ("worker.router", config.router),
        ("firestore.database", config.database),
        ("firestore.location", config.firestore_location),
        ("firestore.collection", config.collection),
        ("accounts.worker", config.worker_account),
        ("accounts.invoker", config.invoker_account),
        *(("accounts.enqueuers", member) for member in config.enqueuers),
        *(("queue.name", queue.name) for queue in config.queues),
        *(("job.name", job.name) for job in config.jobs),
        *(("job.schedule", job.schedule) for job in config.jobs),
        *(("job.time_zone", job.time_zone) for job in config.jobs),
    ]
    for name, value in values:
        pattern, meaning = NAME_FORMATS[name]
        if not isinstance(value, str) or not re.fullmatch(pattern, value, re.ASCII):
            problems.append(f"{name} = {value!r} is not {meaning}")
    return problems


def check(config: Config) -> list[str]:
    """Every relation between deadlines, leases and limits that a working deploy needs."""
    problems = []
    if config.region not in REGIONS and not config.allow_unlisted_region:
        problems.append(
            f"region = {config.region!r} is not a Google Cloud region "
            "(cloud.google.com/about/locations); if Google added it lately, set "
            "allow_unlisted_region = true"
        )
    if config.server not in SERVERS:
        problems.append(f"worker.server = {config.server!r}: use one of {', '.join(SERVERS)}")
    if not config.queues:
        problems.append("define at least one [[queue]]")
    if not 1 <= config.request_timeout <= 3600:
        problems.append("worker.request_timeout must be 1 to 3600 seconds (Cloud Run's limit)")
    if config.lease < 30:
        problems.append("worker.lease must be at least 30 s, so renewals every lease/3 have slack")
    if config.gunicorn_timeout and config.gunicorn_timeout < config.request_timeout:
        problems.append(
            f"worker.gunicorn_timeout ({config.gunicorn_timeout:g} s) would kill a request before "
            f"Cloud Run's request_timeout ({config.request_timeout:g} s): use 0 or at least that"
        )
    if config.retention_days < 1:
        problems.append(
            "worker.retention_days must be at least 1: Cloud Tasks can deliver a task name "
            "again for up to 24 hours"
        )
    for queue in config.queues:
        where = f"queue {queue.name}"
        if not 15 <= queue.dispatch_deadline <= 1800:
            problems.append(f"{where}: dispatch_deadline must be 15 to 1800 seconds")
        if queue.dispatch_deadline > config.request_timeout:
            problems.append(
                f"{where}: dispatch_deadline ({queue.dispatch_deadline:g} s) is longer than "
                f"worker.request_timeout ({config.request_timeout:g} s): Cloud Run would cut "
                "requests Cloud Tasks still waits for"
            )
        if queue.max_retry_duration > config.retention_days * 86400:
            problems.append(
                f"{where}: max_retry_duration outlives worker.retention_days: a late retry would "
                "find no record and run again"
            )
        if not 0 < queue.max_dispatches_per_second <= 500:
            problems.append(f"{where}: max_dispatches_per_second must be in (0, 500]")
        if not 0 < queue.max_concurrent_dispatches <= 5000:
            problems.append(f"{where}: max_concurrent_dispatches must be in (0, 5000]")
        if queue.max_attempts == 0 or queue.max_attempts < -1:
            problems.append(f"{where}: max_attempts must be -1 (unlimited) or positive")
        if queue.min_backoff > queue.max_backoff:
            problems.append(f"{where}: min_backoff exceeds max_backoff")
    for job in config.jobs:
        where = f"job {job.name}"
        if len(job.schedule.split()) != 5:
            problems.append(
                f"{where}: schedule must be unix-cron (5 fields) so ScheduleTime is sent"
            )
        elif problem := never_fires(job):
            problems.append(f"{where}: {problem}")
        if job.attempt_deadline > config.request_timeout:
            problems.append(f"{where}: attempt_deadline is longer than worker.request_timeout")
    return problems


def never_fires(job: Job) -> str | None:
    """Why ``job``'s schedule has no slot (``0 0 31 2 *``), or None. tasklease.cron needs
    croniter, imported here only: without it the kit runs on, and Cloud Scheduler judges."""
    try:
        from tasklease import cron  # noqa: PLC0415
    except ImportError:
        return None
    try:
        cron.check(job.schedule, job.time_zone, datetime.now(UTC))
    except ValueError as exc:
        return str(exc)
    return None


def check_proxies(config: Config) -> list[str]:
    """Each proxy target a full resource name of its kind, in characters gcloud takes."""
    project = NAME_FORMATS["project"][0]
    problems = []
    for job in config.jobs:
        if job.proxy is None:
            continue
        collection, name = PROXY_KINDS[job.proxy.kind]
        pattern = rf"projects/{project}/locations/[a-z][a-z0-9-]{{1,62}}/{collection}/{name}"
        if not isinstance(job.proxy.resource, str) or not re.fullmatch(
            pattern, job.proxy.resource, re.ASCII
        ):
            problems.append(
                f"job {job.name}: proxy.{job.proxy.kind} = {job.proxy.resource!r} is not "
                f"projects/PROJECT/locations/LOCATION/{collection}/NAME"
            )
    return problems
