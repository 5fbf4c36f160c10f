#!/usr/bin/env python3
"""From zero to a running tasklease worker on Cloud Run, in one command.

    deploy/deploy.py [--config deploy/tasklease.toml] [--dry-run] [--teardown]

Reads one TOML file (see deploy/tasklease.toml) and, with the gcloud CLI: enables the APIs,
creates the Firestore database with a TTL policy on the runs' expire_at and the indexes the
run listings need, the two service accounts (the worker's runtime identity, and the
invoker that Cloud Tasks and Scheduler put in their OIDC tokens), the queues, the worker on
Cloud Run from source (private: --no-allow-unauthenticated) and the Scheduler jobs, granting
each identity only what it needs, on the narrowest resource that takes the grant.

Every step first looks at what exists and changes only what differs, so a second run changes
nothing. --dry-run prints every command, in order, and runs none (not even the look-ups: it
plans as for an empty project). Needs only Python 3.11+ and gcloud.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script from a checkout (deploy/deploy.py), the source defaults to that checkout.
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = Path(__file__).with_name("tasklease.toml")
APIS = (
    "run.googleapis.com",
    "cloudbuild.googleapis.com",
    "artifactregistry.googleapis.com",
    "cloudtasks.googleapis.com",
    "cloudscheduler.googleapis.com",
    "firestore.googleapis.com",
)
DIGEST_LABEL = "tasklease-digest"
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
}
NOT_FOUND_MARKERS = ("not_found", "not found", "does not exist", "404")


class DeployError(Exception):
    """A configuration that cannot work, or a gcloud call that failed."""


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


@dataclass(frozen=True)
class Job:
    name: str
    schedule: str
    time_zone: str = "Etc/UTC"
    attempt_deadline: float = 180
    retry_count: int = 0
    min_backoff: float = 5
    max_backoff: float = 3600
    max_doublings: int = 5
    proxy: Proxy | None = None  # A built-in target the worker starts (see the proxy block).


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

    @property
    def worker_email(self) -> str:
        return f"{self.worker_account}@{self.project}.iam.gserviceaccount.com"

    @property
    def invoker_email(self) -> str:
        return f"{self.invoker_account}@{self.project}.iam.gserviceaccount.com"


def load_config(path: Path) -> Config:
    """Read and check the TOML file; raise DeployError listing every problem."""
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
            jobs=tuple(
                Job(
                    **{k: v for k, v in job.items() if k not in ("retry", "proxy")},
                    **job.get("retry", {}),
                    proxy=parse_proxy(job.get("proxy")),
                )
                for job in raw.get("job", [])
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DeployError(f"{path}: missing or invalid setting: {exc}") from exc
    problems = check_names(config) or check_proxies(config) or check(config)
    if problems:
        raise DeployError(f"{path} is inconsistent:\n" + "\n".join(f"  - {p}" for p in problems))
    return config


def check_names(config: Config) -> list[str]:
    """Every name, ID and reference in the character set its target accepts, so nothing in
    the file can add a flag or an environment variable to a gcloud call."""
    values: list[tuple[str, Any]] = [
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
    problems = []
    for name, value in values:
        pattern, meaning = NAME_FORMATS[name]
        if not isinstance(value, str) or not re.fullmatch(pattern, value, re.ASCII):
            problems.append(f"{name} = {value!r} is not {meaning}")
    return problems


def check(config: Config) -> list[str]:
    """Every relation between deadlines, leases and limits that a working deploy needs."""
    problems = []
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
        if not 15 <= job.attempt_deadline <= 1800:
            problems.append(f"{where}: attempt_deadline must be 15 to 1800 seconds")
        if job.attempt_deadline > config.request_timeout:
            problems.append(f"{where}: attempt_deadline is longer than worker.request_timeout")
        if not 0 <= job.retry_count <= 5:
            problems.append(f"{where}: retry_count must be 0 to 5")
    return problems


class Gcloud:
    """Runs gcloud: look-ups return parsed JSON (None when absent); changes are printed and
    run. With ``dry_run``, nothing runs: look-ups find nothing and changes are only printed."""

    def __init__(self, *, dry_run: bool, executable: str = "gcloud") -> None:
        self.dry_run = dry_run
        self.executable = executable

    def read(self, *args: str) -> Any:
        command = [self.executable, *args, "--format=json"]
        if self.dry_run:
            print(f"# check: {shlex.join(command)}")
            return None
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            if any(marker in result.stderr.lower() for marker in NOT_FOUND_MARKERS):
                return None
            raise DeployError(f"{shlex.join(command)} failed:\n{result.stderr.strip()}")
        return json.loads(result.stdout or "null")

    def change(self, *args: str) -> None:
        command = [self.executable, *args]
        print(f"{'' if self.dry_run else '+ '}{shlex.join(command)}", flush=True)
        if self.dry_run:
            return
        result = subprocess.run(command, check=False)
        if result.returncode != 0:
            raise DeployError(f"{shlex.join(command)} failed with exit code {result.returncode}")

    @staticmethod
    def unchanged(what: str) -> None:
        print(f"  = {what}: up to date")


class Deployer:
    def __init__(self, config: Config, gcloud: Gcloud, source: Path = ROOT) -> None:
        self.c = config
        self.g = gcloud
        self.source = source  # The directory sent to Cloud Build (`run deploy --source`).
        self.p = f"--project={config.project}"

    def deploy(self) -> None:
        self.enable_apis()
        self.firestore()
        self.service_accounts()
        self.grant_project_role(f"serviceAccount:{self.c.worker_email}", "roles/datastore.user")
        for queue in self.c.queues:
            self.queue(queue)
            for member in self.enqueuers():
                self.grant_on_queue(queue, member)
        for member in self.enqueuers():
            # actAs the invoker, to create tasks that carry its OIDC token: on that account only.
            self.grant_on_account(self.c.invoker_email, member, "roles/iam.serviceAccountUser")
        url = self.worker()
        self.grant_on_service(f"serviceAccount:{self.c.invoker_email}", "roles/run.invoker")
        self.proxy_grants()  # Before the jobs, so a proxy job's first run may start its target.
        for job in self.c.jobs:
            self.job(job, url)
        print(
            f"\nworker: {url}\nverify: gcloud run services describe {self.c.service} "
            f"--region={self.c.region} {self.p}"
        )

    def teardown(self) -> None:
        location = f"--location={self.c.region}"
        for job in self.c.jobs:
            if self.g.read("scheduler", "jobs", "describe", job.name, location, self.p) is not None:
                self.g.change("scheduler", "jobs", "delete", job.name, location, self.p, "--quiet")
        for queue in self.c.queues:
            if self.g.read("tasks", "queues", "describe", queue.name, location, self.p) is not None:
                self.g.change("tasks", "queues", "delete", queue.name, location, self.p, "--quiet")
        region = f"--region={self.c.region}"
        if self.g.read("run", "services", "describe", self.c.service, region, self.p) is not None:
            self.g.change("run", "services", "delete", self.c.service, region, self.p, "--quiet")
        self.g.change(
            "projects",
            "remove-iam-policy-binding",
            self.c.project,
            f"--member=serviceAccount:{self.c.worker_email}",
            "--role=roles/datastore.user",
            "--condition=None",
        )
        for email in (self.c.worker_email, self.c.invoker_email):
            if self.g.read("iam", "service-accounts", "describe", email, self.p) is not None:
                self.g.change("iam", "service-accounts", "delete", email, self.p, "--quiet")
        self.proxy_teardown()
        print(f"kept: the Firestore database {self.c.database} and its data, and the enabled APIs")

    def enqueuers(self) -> list[str]:
        members = [f"serviceAccount:{self.c.worker_email}"] if self.c.fan_out else []
        return members + list(self.c.enqueuers)

    def enable_apis(self) -> None:
        enabled = self.g.read("services", "list", "--enabled", self.p) or []
        names = {service.get("config", {}).get("name") for service in enabled}
        missing = [api for api in APIS if api not in names]
        if missing:
            self.g.change("services", "enable", *missing, self.p)
        else:
            self.g.unchanged("APIs")

    def firestore(self) -> None:
        database = f"--database={self.c.database}"
        if self.g.read("firestore", "databases", "describe", database, self.p) is None:
            self.g.change(
                "firestore",
                "databases",
                "create",
                database,
                f"--location={self.c.firestore_location}",
                "--type=firestore-native",
                self.p,
            )
        else:
            self.g.unchanged(f"Firestore database {self.c.database}")
        group = f"--collection-group={self.c.collection}"
        ttl = self.g.read("firestore", "fields", "ttls", "list", group, database, self.p) or []
        if not any(
            str(entry.get("name", "")).endswith("/fields/expire_at")
            and entry.get("ttlConfig", {}).get("state") in ("ACTIVE", "CREATING")
            for entry in ttl
        ):
            self.g.change(
                "firestore",
                "fields",
                "ttls",
                "update",
                "expire_at",
                group,
                "--enable-ttl",
                database,
                self.p,
                "--async",
            )
        else:
            self.g.unchanged("TTL policy on expire_at")
        indexes = self.g.read("firestore", "indexes", "composite", "list", database, self.p) or []
        # Listing runs newest first, by status (the dead-letter listing, `tasklease runs`) or by
        # handler (`tasklease runs list --handler`): one equality field, then claimed_at.
        for first in ("status", "handler"):
            wanted = [(first, "ASCENDING"), ("claimed_at", "DESCENDING")]
            if not any(
                f"/collectionGroups/{self.c.collection}/" in index.get("name", "")
                and [(f.get("fieldPath"), f.get("order")) for f in index.get("fields", [])][:2]
                == wanted
                for index in indexes
            ):
                self.g.change(
                    "firestore",
                    "indexes",
                    "composite",
                    "create",
                    group,
                    f"--field-config=field-path={first},order=ascending",
                    "--field-config=field-path=claimed_at,order=descending",
                    database,
                    self.p,
                    "--async",
                )
            else:
                self.g.unchanged(f"index on {first} + claimed_at")

    def service_accounts(self) -> None:
        for name, email, title in [
            (self.c.worker_account, self.c.worker_email, "tasklease worker runtime"),
            (self.c.invoker_account, self.c.invoker_email, "tasklease invoker (OIDC tokens)"),
        ]:
            if self.g.read("iam", "service-accounts", "describe", email, self.p) is None:
                self.g.change(
                    "iam", "service-accounts", "create", name, f"--display-name={title}", self.p
                )
            else:
                self.g.unchanged(f"service account {email}")

    def queue(self, queue: Queue) -> None:
        location = f"--location={self.c.region}"
        flags = [
            f"--max-attempts={queue.max_attempts}",
            f"--max-retry-duration={_seconds(queue.max_retry_duration)}",
            f"--min-backoff={_seconds(queue.min_backoff)}",
            f"--max-backoff={_seconds(queue.max_backoff)}",
            f"--max-doublings={queue.max_doublings}",
            f"--max-dispatches-per-second={queue.max_dispatches_per_second:g}",
            f"--max-concurrent-dispatches={queue.max_concurrent_dispatches}",
        ]
        current = self.g.read("tasks", "queues", "describe", queue.name, location, self.p)
        if current is None:
            self.g.change("tasks", "queues", "create", queue.name, location, *flags, self.p)
        elif _queue_settings(current) != _queue_settings_wanted(queue):
            self.g.change("tasks", "queues", "update", queue.name, location, *flags, self.p)
        else:
            self.g.unchanged(f"queue {queue.name}")

    def worker(self) -> str:
        """Deploy the service unless the same source and settings are already live."""
        number = "PROJECT_NUMBER"
        if not self.g.dry_run:
            described = self.g.read("projects", "describe", self.c.project) or {}
            number = str(described.get("projectNumber", ""))
            if not number.isdigit() or not number.isascii():
                raise DeployError(f"gcloud gave {number!r} as the project number")
        url = f"https://{self.c.service}-{number}.{self.c.region}.run.app"
        queue = self.c.queues[0]
        env = {
            "TASKLEASE_ROUTER": self.c.router,
            "TASKLEASE_STORE": f"firestore://?collection={self.c.collection}&database={self.c.database}",
            "TASKLEASE_AUTH": "oidc",
            "TASKLEASE_ALLOWED_SERVICE_ACCOUNTS": self.c.invoker_email,
            "TASKLEASE_AUDIENCE": url,
            "GOOGLE_CLOUD_PROJECT": self.c.project,
            "TASKLEASE_PROJECT": self.c.project,
            "TASKLEASE_LOCATION": self.c.region,
            "TASKLEASE_QUEUE": queue.name,
            "TASKLEASE_WORKER_URL": url,
            "TASKLEASE_SERVICE_ACCOUNT": self.c.invoker_email,
            "TASKLEASE_DISPATCH_DEADLINE": f"{queue.dispatch_deadline:g}",
            "WEB_CONCURRENCY": str(self.c.workers),
            "GUNICORN_THREADS": str(self.c.threads),
            "GUNICORN_TIMEOUT": f"{self.c.gunicorn_timeout:g}",
        }
        flags = [
            f"--region={self.c.region}",
            f"--service-account={self.c.worker_email}",
            "--no-allow-unauthenticated",
            f"--timeout={self.c.request_timeout:g}",
            f"--concurrency={self.c.workers * self.c.threads}",
            f"--min-instances={self.c.min_instances}",
            f"--max-instances={self.c.max_instances}",
            # A delimiter that cannot occur in the values (the store URL holds '&' and ',').
            "--set-env-vars=^|^" + "|".join(f"{k}={v}" for k, v in env.items()),
        ]
        digest = _digest(flags, self.source)
        current = self.g.read(
            "run", "services", "describe", self.c.service, f"--region={self.c.region}", self.p
        )
        labels = (current or {}).get("metadata", {}).get("labels", {})
        if current is not None and labels.get(DIGEST_LABEL) == digest:
            self.g.unchanged(f"Cloud Run service {self.c.service} (same source and settings)")
            return url
        self.g.change(
            "run",
            "deploy",
            self.c.service,
            f"--source={self.source}",
            *flags,
            f"--labels={DIGEST_LABEL}={digest}",
            self.p,
            "--quiet",
        )
        return url

    def job(self, job: Job, url: str) -> None:
        location = f"--location={self.c.region}"
        flags = [
            f"--schedule={job.schedule}",
            f"--time-zone={job.time_zone}",
            f"--uri={url}/jobs/{job.name}",
            "--http-method=POST",
            f"--oidc-service-account-email={self.c.invoker_email}",
            f"--oidc-token-audience={url}",
            f"--attempt-deadline={_seconds(job.attempt_deadline)}",
            f"--max-retry-attempts={job.retry_count}",
            f"--min-backoff={_seconds(job.min_backoff)}",
            f"--max-backoff={_seconds(job.max_backoff)}",
            f"--max-doublings={job.max_doublings}",
        ]
        current = self.g.read("scheduler", "jobs", "describe", job.name, location, self.p)
        if current is None:
            self.g.change("scheduler", "jobs", "create", "http", job.name, location, *flags, self.p)
        elif _job_settings(current) != _job_settings_wanted(job, url, self.c.invoker_email):
            self.g.change("scheduler", "jobs", "update", "http", job.name, location, *flags, self.p)
        else:
            self.g.unchanged(f"scheduler job {job.name}")

    def grant_project_role(self, member: str, role: str) -> None:
        # Firestore access has no narrower resource to grant on than the project.
        policy = self.g.read("projects", "get-iam-policy", self.c.project)
        if _has_binding(policy, member, role):
            self.g.unchanged(f"{role} for {member}")
        else:
            self.g.change(
                "projects",
                "add-iam-policy-binding",
                self.c.project,
                f"--member={member}",
                f"--role={role}",
                "--condition=None",
            )

    def grant_on_queue(self, queue: Queue, member: str) -> None:
        location = f"--location={self.c.region}"
        role = "roles/cloudtasks.enqueuer"
        policy = self.g.read("tasks", "queues", "get-iam-policy", queue.name, location, self.p)
        if _has_binding(policy, member, role):
            self.g.unchanged(f"{role} on queue {queue.name} for {member}")
        else:
            self.g.change(
                "tasks",
                "queues",
                "add-iam-policy-binding",
                queue.name,
                location,
                f"--member={member}",
                f"--role={role}",
                self.p,
            )

    def grant_on_account(self, email: str, member: str, role: str) -> None:
        policy = self.g.read("iam", "service-accounts", "get-iam-policy", email, self.p)
        if _has_binding(policy, member, role):
            self.g.unchanged(f"{role} on {email} for {member}")
        else:
            self.g.change(
                "iam",
                "service-accounts",
                "add-iam-policy-binding",
                email,
                f"--member={member}",
                f"--role={role}",
                self.p,
            )

    def grant_on_service(self, member: str, role: str) -> None:
        region = f"--region={self.c.region}"
        policy = self.g.read("run", "services", "get-iam-policy", self.c.service, region, self.p)
        if _has_binding(policy, member, role):
            self.g.unchanged(f"{role} on service {self.c.service} for {member}")
        else:
            self.g.change(
                "run",
                "services",
                "add-iam-policy-binding",
                self.c.service,
                region,
                f"--member={member}",
                f"--role={role}",
                self.p,
            )

    # ---- Proxy jobs: the worker starts a Google Cloud API target (worker.targets) --------------
    # Each grant gives the worker's runtime account only the target's role, on the narrowest
    # resource that takes it (PROXY_GRANTS says which, and why).

    def proxy_grants(self) -> None:
        member = f"serviceAccount:{self.c.worker_email}"
        for job in self.c.jobs:
            if job.proxy is None:
                continue
            for scope, role in PROXY_GRANTS[job.proxy.kind]:
                if scope == "project":
                    self.grant_on_target_project(job.proxy.project, member, role)
                else:
                    self.grant_on_run_job(job.proxy, member, role)

    def proxy_teardown(self) -> None:
        """Remove the project-wide proxy grants (resource grants go with the deleted account)."""
        member = f"serviceAccount:{self.c.worker_email}"
        for job in self.c.jobs:
            if job.proxy is None:
                continue
            for scope, role in PROXY_GRANTS[job.proxy.kind]:
                if scope != "project":
                    continue
                policy = self.g.read("projects", "get-iam-policy", job.proxy.project)
                if _has_binding(policy, member, role) or self.g.dry_run:
                    self.g.change(
                        "projects",
                        "remove-iam-policy-binding",
                        job.proxy.project,
                        f"--member={member}",
                        f"--role={role}",
                        "--condition=None",
                    )

    def grant_on_target_project(self, project: str, member: str, role: str) -> None:
        policy = self.g.read("projects", "get-iam-policy", project)
        if _has_binding(policy, member, role):
            self.g.unchanged(f"{role} on project {project} for {member}")
        else:
            self.g.change(
                "projects",
                "add-iam-policy-binding",
                project,
                f"--member={member}",
                f"--role={role}",
                "--condition=None",
            )

    def grant_on_run_job(self, proxy: Proxy, member: str, role: str) -> None:
        where = (proxy.name, f"--region={proxy.location}", f"--project={proxy.project}")
        policy = self.g.read("run", "jobs", "get-iam-policy", *where)
        if _has_binding(policy, member, role):
            self.g.unchanged(f"{role} on job {proxy.name} for {member}")
        else:
            self.g.change(
                "run",
                "jobs",
                "add-iam-policy-binding",
                *where,
                f"--member={member}",
                f"--role={role}",
            )


# What a proxy target may be, and what its starting needs. Scopes: "project" (the target's
# project; the API has no narrower resource that takes the role) or "job" (the Cloud Run job).
PROXY_KINDS = {
    "workflow": ("workflows", r"[A-Za-z][A-Za-z0-9_-]{0,127}"),
    "run_job": ("jobs", r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?"),
    "build_trigger": ("triggers", r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"),
}
PROXY_GRANTS: dict[str, tuple[tuple[str, str], ...]] = {
    # workflows.executions.create/get/list. Workflows roles are granted on projects only
    # (IAM's "lowest-level resource"; gcloud has no per-workflow IAM command).
    "workflow": (("project", "roles/workflows.invoker"),),
    # RunJob with overrides (the key is an env override) needs run.jobs.runWithOverrides,
    # which run.invoker lacks; the look-up on a retry lists the job's executions: a
    # read-only role on the same job.
    "run_job": (("job", "roles/run.jobsExecutorWithOverrides"), ("job", "roles/run.viewer")),
    # cloudbuild.builds.create and .list; build triggers take no IAM policy of their own.
    "build_trigger": (("project", "roles/cloudbuild.builds.editor"),),
}


@dataclass(frozen=True)
class Proxy:
    kind: str  # A key of PROXY_KINDS.
    resource: str  # projects/P/locations/L/<collection>/NAME

    @property
    def _parts(self) -> list[str]:
        return self.resource.split("/")

    @property
    def project(self) -> str:
        return self._parts[1]

    @property
    def location(self) -> str:
        return self._parts[3]

    @property
    def name(self) -> str:
        return self._parts[5]


def parse_proxy(raw: Any) -> Proxy | None:
    """``[job.proxy]``: exactly one of ``workflow``, ``run_job``, ``build_trigger``."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in PROXY_KINDS:
        raise ValueError(f"job.proxy must set exactly one of {', '.join(PROXY_KINDS)}: {raw!r}")
    [(kind, resource)] = raw.items()
    return Proxy(kind, resource)


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


# The client library each proxy target imports (worker.targets): a plain dependency of the
# source, since the buildpack installs no extras such as tasklease[workflows].
PROXY_LIBRARIES = {
    "workflow": "google-cloud-workflows",
    "run_job": "google-cloud-run",
    "build_trigger": "google-cloud-build",
}


def check_proxy_source(source: Path, config: Config) -> list[str]:
    """Each proxy job's client library installed by the buildpack, or its runs would all fail."""
    kinds = sorted({job.proxy.kind for job in config.jobs if job.proxy is not None})
    if not kinds:
        return []
    try:
        installed, what = _installed_by_buildpack(source)
    except DeployError:
        return []  # check_source reported it.
    missing = [PROXY_LIBRARIES[kind] for kind in kinds if PROXY_LIBRARIES[kind] not in installed]
    if not missing:
        return []
    return [
        f"{what} does not install {', '.join(missing)}: the proxy jobs' targets import it. "
        "Add it as a plain dependency (the buildpack installs no extras)"
    ]


def _has_binding(policy: Any, member: str, role: str) -> bool:
    return any(
        binding.get("role") == role and member in binding.get("members", [])
        for binding in (policy or {}).get("bindings", [])
    )


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _duration(value: Any) -> float:
    return float(str(value or "0s").rstrip("s") or 0)


def _queue_settings(described: dict[str, Any]) -> tuple[Any, ...]:
    rate, retry = described.get("rateLimits", {}), described.get("retryConfig", {})
    return (
        int(retry.get("maxAttempts", 100)),
        _duration(retry.get("maxRetryDuration")),
        _duration(retry.get("minBackoff")),
        _duration(retry.get("maxBackoff")),
        int(retry.get("maxDoublings", 16)),
        float(rate.get("maxDispatchesPerSecond", 500)),
        int(rate.get("maxConcurrentDispatches", 1000)),
    )


def _queue_settings_wanted(queue: Queue) -> tuple[Any, ...]:
    return (
        queue.max_attempts,
        float(queue.max_retry_duration),
        float(queue.min_backoff),
        float(queue.max_backoff),
        queue.max_doublings,
        float(queue.max_dispatches_per_second),
        queue.max_concurrent_dispatches,
    )


def _job_settings(described: dict[str, Any]) -> tuple[Any, ...]:
    target, retry = described.get("httpTarget", {}), described.get("retryConfig", {})
    oidc = target.get("oidcToken", {})
    return (
        described.get("schedule"),
        described.get("timeZone"),
        target.get("uri"),
        oidc.get("serviceAccountEmail"),
        oidc.get("audience"),
        _duration(described.get("attemptDeadline")),
        int(retry.get("retryCount", 0)),
        _duration(retry.get("minBackoffDuration")),
        _duration(retry.get("maxBackoffDuration")),
        int(retry.get("maxDoublings", 5)),
    )


def _job_settings_wanted(job: Job, url: str, invoker: str) -> tuple[Any, ...]:
    return (
        job.schedule,
        job.time_zone,
        f"{url}/jobs/{job.name}",
        invoker,
        url,
        float(job.attempt_deadline),
        job.retry_count,
        float(job.min_backoff),
        float(job.max_backoff),
        job.max_doublings,
    )


def _digest(flags: list[str], source: Path = ROOT) -> str:
    """The source tree (git's view of it, else every file) and the deploy settings, hashed."""
    hasher = hashlib.sha256("\n".join(flags).encode())
    for name in _source_files(source):
        path = source / name.decode()
        if path.is_file():
            hasher.update(name + b"\0" + path.read_bytes())
    return hasher.hexdigest()[:16]


def _source_files(source: Path) -> list[bytes]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=source,
        capture_output=True,
        check=False,
    )
    if listed.returncode == 0:
        return sorted(filter(None, listed.stdout.split(b"\0")))
    names = []
    for directory, subdirectories, files in os.walk(source):
        subdirectories[:] = sorted(d for d in subdirectories if d not in _NOT_SOURCE)
        for file in files:
            names.append(str(Path(directory, file).relative_to(source)).encode())
    return sorted(names)


# What the deployed worker imports that the buildpack must install (platform-facts.md, "Cloud
# Run deploys from source"): the Procfile's server and the production store. tasklease lists
# both as plain dependencies, so a source that installs tasklease installs them.
WORKER_NEEDS = ("gunicorn", "google-cloud-firestore")
PROCFILE = (
    "web: gunicorn --bind :$PORT --workers ${WEB_CONCURRENCY:-2} --threads "
    "${GUNICORN_THREADS:-8} --timeout ${GUNICORN_TIMEOUT:-0} --access-logfile - "
    "'tasklease.worker.wsgi:app'\n"
)
_NOT_SOURCE = {".git", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache"}
_REQUIREMENT_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def check_source(source: Path, router: str) -> list[str]:
    """What would keep the worker built from ``source`` from starting, found before any gcloud
    call: the buildpack installs ``requirements.txt`` if present, else the ``[project]``
    dependencies of ``pyproject.toml``, never extras; gunicorn imports
    ``tasklease.worker.wsgi``, which imports the router module from the source."""
    if not source.is_dir():
        return [f"source {source} is not a directory"]
    problems = []
    try:
        installed, what = _installed_by_buildpack(source)
    except DeployError as exc:
        installed, what = set(), ""
        problems.append(str(exc))
    if what and "tasklease" not in installed:
        problems.append(
            f"{what} does not install tasklease: the worker (tasklease.worker.wsgi) would not "
            "import. "
            "Add tasklease to it (not as an extra of your own project: the buildpack installs "
            "no extras)"
        )
    elif what:
        missing = [name for name in WORKER_NEEDS if name not in installed]
        if missing:
            problems.append(
                f"{what} does not install {', '.join(missing)}: the Procfile's gunicorn and the "
                "Firestore store need them as plain dependencies (the buildpack installs no "
                "extras)"
            )
    module = router.partition(":")[0]
    if not _module_in_source(source, module):
        problems.append(
            f"router {router}: no module {module} in {source} (looked for "
            f"{module.replace('.', '/')}.py or a package, also under src/)"
        )
    procfile = source / "Procfile"
    if procfile.exists() and not any(
        line.startswith("web:") for line in procfile.read_text().splitlines()
    ):
        problems.append(f"{procfile} has no web: line, the entrypoint Cloud Run starts")
    return problems


def ensure_procfile(source: Path, *, dry_run: bool) -> None:
    """Write tasklease's Procfile into ``source`` unless it has one (the buildpack reads it)."""
    procfile = source / "Procfile"
    if procfile.exists():
        return
    if dry_run:
        print(f"# would write {procfile}: {PROCFILE.strip()}")
        return
    procfile.write_text(PROCFILE)
    print(f"wrote {procfile}")


def _installed_by_buildpack(source: Path) -> tuple[set[str], str]:
    """The normalised names of what the buildpack installs from ``source``, and from where."""
    requirements = source / "requirements.txt"
    if requirements.exists():
        return _requirements(requirements, source, seen=set()), str(requirements)
    if (source / "pyproject.toml").exists():
        return _project(source), f"{source / 'pyproject.toml'} ([project] dependencies)"
    raise DeployError(
        f"{source} has neither requirements.txt nor pyproject.toml: the buildpack would install "
        "nothing, and the worker could not start"
    )


def _project(directory: Path) -> set[str]:
    """A pyproject project's own name and its [project] dependencies (extras excluded)."""
    try:
        project = tomllib.loads((directory / "pyproject.toml").read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DeployError(f"cannot read {directory / 'pyproject.toml'}: {exc}") from exc
    if not project:
        raise DeployError(
            f"{directory / 'pyproject.toml'} has no [project] table: the buildpack reads "
            "dependencies from [project] (or use a requirements.txt)"
        )
    names = {_normalise(project.get("name", ""))}
    for requirement in project.get("dependencies", []):
        match = _REQUIREMENT_NAME.match(requirement.strip())
        if match:
            names |= _installs(match.group())
    return names


def _requirements(path: Path, source: Path, seen: set[Path]) -> set[str]:
    """Names a requirements file installs: names, ``name @ url``, ``#egg=name``, ``-r`` files
    and local projects (``.`` or ``-e ./dir``) inside the source."""
    if path in seen or not path.exists():
        return set()
    seen.add(path)
    names: set[str] = set()
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        option, _, value = line.partition(" ")
        if option in ("-r", "--requirement"):
            names |= _requirements(path.parent / value.strip(), source, seen)
            continue
        if option in ("-e", "--editable"):
            line = value.strip()
        elif line.startswith("-"):
            continue  # --index-url, -c, --hash ...: no package named.
        if "#egg=" in line:
            names |= _installs(line.split("#egg=", 1)[1].split("&")[0])
        elif line.startswith((".", "/")):
            local = (path.parent / line.split("[")[0]).resolve()
            if local.is_relative_to(source.resolve()) and (local / "pyproject.toml").exists():
                names |= _project(local)
        else:
            match = _REQUIREMENT_NAME.match(line)
            if match and "://" not in line.split("@")[0]:
                names |= _installs(match.group())
    return names


def _installs(requirement_name: str) -> set[str]:
    """A requirement's name, with the worker's packages when it is tasklease (they are its
    plain dependencies; this repository's own pyproject is checked as a project, not so)."""
    name = _normalise(requirement_name)
    return {name, *WORKER_NEEDS} if name == "tasklease" else {name}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _module_in_source(source: Path, module: str) -> bool:
    relative = Path(*module.split(".")) if module else Path("-")
    return any(
        (root / relative).with_suffix(".py").is_file()
        or (root / relative / "__init__.py").is_file()
        for root in (source, source / "src")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument(
        "--source", type=Path, default=ROOT, help="the directory Cloud Run builds the worker from"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    parser.add_argument("--teardown", action="store_true", help="delete what deploy created")
    parser.add_argument("--gcloud", default="gcloud", help="the gcloud executable")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        source = args.source.resolve()
        deployer = Deployer(config, Gcloud(dry_run=args.dry_run, executable=args.gcloud), source)
        if args.teardown:
            deployer.teardown()
        else:
            problems = check_source(source, config.router) or check_proxy_source(source, config)
            if problems:
                raise DeployError(
                    f"the worker built from {source} could not start:\n"
                    + "\n".join(f"  - {p}" for p in problems)
                )
            ensure_procfile(source, dry_run=args.dry_run)
            deployer.deploy()
    except DeployError as exc:
        print(f"deploy: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
