"""The ``[[job]]`` table: one Cloud Scheduler job as tasklease's TOML files describe it.

One schema and one loader for every file that holds such tables: the deploy config
(``tasklease.toml``, what ``tasklease deploy`` creates), the emulator's ``--scheduler-config``,
the schedules ``tasklease runs stuck`` and the dashboard check, and the pytest plugin's stub
scheduler. Each of them adapts a :class:`Job` with a small function, refusing what it cannot
honour. Standard library only, as the deploy kit is; the cron math is :mod:`tasklease.cron`'s.

.. code-block:: toml

    [[job]]
    name = "nightly_reports"       # the job ID: the worker handles POST /jobs/<name>
    schedule = "0 3 * * *"         # unix-cron (the emulator also runs English-like ones)
    time_zone = "Etc/UTC"          # a tz database name
    description = ""
    attempt_deadline = 180         # seconds, 15 to 1800
    url = "http://127.0.0.1:8080/jobs/nightly_reports"  # the emulator's target; a deploy
    http_method = "POST"           # targets the worker itself, with its invoker's token
    body = ""
    headers = {}
    service_account = "..."        # an OIDC token of this account (emulator), for ``audience``

    [job.retry]                    # Cloud Scheduler's RetryConfig; these are its defaults
    retry_count = 0                # 0 to 5
    max_retry_duration = 0         # seconds; 0: unlimited
    min_backoff = 5
    max_backoff = 3600
    max_doublings = 5

    [job.proxy]                    # exactly one: a Google Cloud API target the worker starts
    workflow = "projects/P/locations/L/workflows/NAME"   # or run_job, build_trigger
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasklease.errors import ConfigurationError

DEFAULT_TIME_ZONE = "Etc/UTC"
# Cloud Scheduler's limits and defaults for HTTP targets (docs/platform-facts.md; the REST
# reference of Job.attemptDeadline and RetryConfig): stated here once for tasklease's files.
DEFAULT_ATTEMPT_DEADLINE = 180.0
MIN_ATTEMPT_DEADLINE, MAX_ATTEMPT_DEADLINE = 15.0, 1800.0
MAX_RETRY_COUNT = 5
# What a proxy target may be: its collection and the ID's characters, per kind.
PROXY_KINDS = {
    "workflow": ("workflows", r"[A-Za-z][A-Za-z0-9_-]{0,127}"),
    "run_job": ("jobs", r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?"),
    "build_trigger": ("triggers", r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"),
}


class InvalidJob(ConfigurationError):
    """A ``[[job]]`` table that is not one: the message names the job and the field."""


@dataclass(frozen=True)
class Retry:
    """A job's RetryConfig, defaulting to Cloud Scheduler's: no retry; backoff from 5 s,
    doubling 5 times, up to 1 h; no limit on the retries' duration."""

    retry_count: int = 0
    max_retry_duration: float = 0.0
    min_backoff: float = 5.0
    max_backoff: float = 3600.0
    max_doublings: int = 5


@dataclass(frozen=True)
class Proxy:
    """``[job.proxy]``: the Google Cloud API target the worker starts once per run."""

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


@dataclass(frozen=True)
class Job:
    """One ``[[job]]`` table, with Cloud Scheduler's defaults for what it leaves out."""

    name: str
    schedule: str
    time_zone: str = DEFAULT_TIME_ZONE
    description: str = ""
    attempt_deadline: float = DEFAULT_ATTEMPT_DEADLINE
    url: str | None = None
    http_method: str = "POST"
    body: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    service_account: str | None = None
    audience: str | None = None
    retry: Retry = field(default_factory=Retry)
    proxy: Proxy | None = None

    def given(self) -> set[str]:
        """The fields (``retry.*`` for the retry table's) that differ from the defaults: what
        a user that ignores a field can refuse when it is set."""
        blank = Job(self.name, self.schedule)
        fields = {f for f in _FIELDS if getattr(self, f) != getattr(blank, f)} - {"retry"}
        retry = {
            f"retry.{f}" for f in _RETRY_FIELDS if getattr(self.retry, f) != getattr(Retry(), f)
        }
        return fields | retry


_FIELDS = (
    "name",
    "schedule",
    "time_zone",
    "description",
    "attempt_deadline",
    "url",
    "http_method",
    "body",
    "headers",
    "service_account",
    "audience",
    "retry",
    "proxy",
)
_RETRY_FIELDS = ("retry_count", "max_retry_duration", "min_backoff", "max_backoff", "max_doublings")


def load_jobs(path: str | Path, declared: Iterable[Job] = ()) -> list[Job]:
    """The ``[[job]]`` tables of the TOML file ``path`` (its other tables are not theirs) over
    the ``declared`` jobs (see :func:`parse_jobs`); InvalidJob for one that is not a job,
    OSError if the file cannot be read."""
    return parse_jobs(read_tables(path), source=str(path), declared=declared)


def read_tables(path: str | Path) -> Any:
    """The raw ``[[job]]`` tables of the TOML file ``path``, checked by :func:`parse_jobs`."""
    with Path(path).open("rb") as handle:
        try:
            document = tomllib.load(handle)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidJob(f"{path}: {exc}") from exc
    return document.get("job", [])


def parse_jobs(tables: Any, source: str = "", declared: Iterable[Job] = ()) -> list[Job]:
    """Each table of a TOML ``[[job]]`` array, with unique names; ``source`` (a path) starts
    each message.

    ``declared`` are the jobs a router declares in code (``@router.scheduled(...,
    schedule=...)``). The precedence rule: a table named as a declared job overrides the
    fields it sets, and only those (``[job.retry]`` key by key), so it may leave out
    ``schedule``; a declared job no table names is kept as declared; a table naming no
    declared job is a job of its own, as without code. Declared jobs come first, in their
    order, then the others in the file's."""
    prefix = f"{source}: " if source else ""
    if not isinstance(tables, list):
        raise InvalidJob(f"{prefix}job must be an array of tables ([[job]])")
    code = {job.name: job for job in declared}
    merged: dict[str, Job] = dict(code)
    seen: set[str] = set()
    for table in tables:
        name = table.get("name") if isinstance(table, Mapping) else None
        base = code.get(name) if isinstance(name, str) else None
        try:
            job = parse_job(table if base is None else overlay(base, table))
        except InvalidJob as exc:
            raise InvalidJob(f"{prefix}{exc}") from exc
        if job.name in seen:
            raise InvalidJob(f"{prefix}job {job.name}: defined twice")
        seen.add(job.name)
        merged[job.name] = job
    return list(merged.values())


def overlay(job: Job, table: Mapping[str, Any]) -> dict[str, Any]:
    """``job`` as a ``[[job]]`` table with the keys of ``table`` over it (those of its
    ``[job.retry]`` over the job's retry, one by one)."""
    merged = {**as_table(job), **table}
    if isinstance(table.get("retry"), Mapping):
        merged["retry"] = {**as_table(job)["retry"], **table["retry"]}
    return merged


def as_table(job: Job) -> dict[str, Any]:
    """The ``[[job]]`` table :func:`parse_job` reads back as ``job``."""
    table: dict[str, Any] = {f: getattr(job, f) for f in _FIELDS if getattr(job, f) is not None}
    table["headers"] = dict(job.headers)
    table["retry"] = {f: getattr(job.retry, f) for f in _RETRY_FIELDS}
    if job.proxy is not None:
        table["proxy"] = {job.proxy.kind: job.proxy.resource}
    return table


def parse_job(table: Any) -> Job:
    """One ``[[job]]`` table; InvalidJob naming the job and the field that is wrong."""
    if not isinstance(table, Mapping):
        raise InvalidJob(f"every [[job]] must be a table, not {table!r}")
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidJob(f"every [[job]] needs a name (a job ID), not {name!r}")
    fields = _Fields(f"job {name}", table)
    fields.refuse_unknown(_FIELDS, hint=lambda key: key in _RETRY_FIELDS)
    deadline = fields.number("attempt_deadline", DEFAULT_ATTEMPT_DEADLINE)
    if not MIN_ATTEMPT_DEADLINE <= deadline <= MAX_ATTEMPT_DEADLINE:
        fields.refuse("attempt_deadline", "must be 15 to 1800 seconds")
    headers = fields.table("headers")
    for key, value in headers.items():
        if not isinstance(value, str):
            fields.refuse(f"headers.{key}", "must be a string")
    return Job(
        name=name,
        schedule=fields.text("schedule", None),
        time_zone=fields.text("time_zone", DEFAULT_TIME_ZONE),
        description=fields.text("description", ""),
        attempt_deadline=deadline,
        url=fields.optional_text("url"),
        http_method=fields.text("http_method", "POST"),
        body=fields.text("body", ""),
        headers=dict(headers),
        service_account=fields.optional_text("service_account"),
        audience=fields.optional_text("audience"),
        retry=_retry(_Fields(f"job {name}", fields.table("retry"), "retry.")),
        proxy=_proxy(fields, table.get("proxy")),
    )


def _retry(fields: _Fields) -> Retry:
    fields.refuse_unknown(_RETRY_FIELDS)
    defaults = Retry()
    retry = Retry(
        retry_count=fields.integer("retry_count", defaults.retry_count),
        max_retry_duration=fields.number("max_retry_duration", defaults.max_retry_duration),
        min_backoff=fields.number("min_backoff", defaults.min_backoff),
        max_backoff=fields.number("max_backoff", defaults.max_backoff),
        max_doublings=fields.integer("max_doublings", defaults.max_doublings),
    )
    for name, why in retry_problems(retry):
        fields.refuse(name, why)
    return retry


def retry_problems(retry: Retry) -> list[tuple[str, str]]:
    """Each field of ``retry`` outside Cloud Scheduler's limits, and why: what the TOML
    loader and ``@router.scheduled(retry=...)`` both refuse."""
    problems = []
    if not 0 <= retry.retry_count <= MAX_RETRY_COUNT:
        problems.append(("retry_count", f"must be 0 to {MAX_RETRY_COUNT}"))
    for name in ("max_retry_duration", "min_backoff", "max_backoff", "max_doublings"):
        if getattr(retry, name) < 0:
            problems.append((name, "must not be negative"))
    return problems


def _proxy(fields: _Fields, raw: Any) -> Proxy | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or len(raw) != 1 or next(iter(raw)) not in PROXY_KINDS:
        fields.refuse("proxy", f"must set exactly one of {', '.join(PROXY_KINDS)}: {raw!r}")
    [(kind, resource)] = raw.items()
    if not isinstance(resource, str):
        fields.refuse(f"proxy.{kind}", "must be a resource name")
    return Proxy(kind, resource)


class _Fields:
    """Typed reads of one table's fields, each refusal naming the job and the field."""

    def __init__(self, where: str, table: Mapping[str, Any], prefix: str = "") -> None:
        self.where, self.values, self.prefix = where, table, prefix

    def refuse(self, name: str, why: str) -> Any:
        raise InvalidJob(f"{self.where}: {self.prefix}{name} {why}")

    def refuse_unknown(self, known: Iterable[str], hint: Any = None) -> None:
        for key in sorted(set(self.values) - set(known)):
            where = " (it belongs in [job.retry])" if hint and hint(key) else ""
            self.refuse(key, f"is not a [[job]] field{where}")

    def text(self, name: str, default: str | None) -> str:
        value = self.values.get(name, default)
        if value is None:
            return str(self.refuse(name, "is missing"))
        if not isinstance(value, str) or (default is None and not value):
            self.refuse(name, f"must be a non-empty string, not {value!r}")
        return str(value)

    def optional_text(self, name: str) -> str | None:
        return None if self.values.get(name) is None else self.text(name, None)

    def number(self, name: str, default: float) -> float:
        value = self.values.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.refuse(name, f"must be a number of seconds, not {value!r}")
        return float(value)

    def integer(self, name: str, default: int) -> int:
        value = self.values.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.refuse(name, f"must be a whole number, not {value!r}")
        return int(value)

    def table(self, name: str) -> Mapping[str, Any]:
        value = self.values.get(name, {})
        if not isinstance(value, Mapping):
            self.refuse(name, f"must be a table, not {value!r}")
        return value  # type: ignore[no-any-return]
