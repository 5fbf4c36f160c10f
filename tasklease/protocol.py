"""The contract tasklease's producer, worker, stubs, CLI and deploy kit share.

tasklease's own headers and query parameters, the worker's routes, the environment variables
its processes read, the task size limits and the time format. Google's own ``X-CloudTasks-*``
and ``X-CloudScheduler-*`` names are the worker's to parse (:mod:`tasklease.worker.core.
constants`), and the emulator spells them again on its own: it is the oracle the worker is
tested against, so it must not share the worker's mistakes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

# Neither service sends a project or region: the target configures these (headers or query).
PROJECT_HEADER = "X-Tasklease-Project"
LOCATION_HEADER = "X-Tasklease-Location"
PROJECT_QUERY = "project"
LOCATION_QUERY = "location"

# On a continuation task (ctx.continue_later): "<run id>:<sequence number>", the run it resumes.
CONTINUATION_HEADER = "X-Tasklease-Continuation"
# On a child of a fan-out with then= (tasklease.joins.Member.header): its join.
FAN_IN_HEADER = "X-Tasklease-Fan-In"
# On a join's then task: the join whose children's results it receives.
FAN_IN_OF_HEADER = "X-Tasklease-Fan-In-Of"
# On a child of a fan-out without then= (ctx.fan_out, producer.fan_out), and on a fan-out
# child's continuation: its parent's run id. A cancelled parent's pending children never run.
PARENT_HEADER = "X-Tasklease-Parent"
# On a task resuming a waiting run (ctx.wait_for): "<run id>:<delivery>:<how>:<name>", how
# "signal" or "timeout@<its deadline in microseconds since the epoch>".
RESUME_HEADER = "X-Tasklease-Resume"

# Response headers of the worker.
OUTCOME_HEADER = "X-Tasklease-Outcome"
RUN_ID_HEADER = "X-Tasklease-Run-Id"

# Routes.
TASK_ROUTE_PREFIX = "/tasks/"
SCHEDULER_ROUTE_PREFIX = "/jobs/"
SIGNAL_ROUTE_PREFIX = "/signals/"  # POST /signals/<run id>/<name>: tasklease.signal over HTTP.

# Environment variables.
ENV_STORE = "TASKLEASE_STORE"
ENV_AUTH = "TASKLEASE_AUTH"
ENV_ROUTER = "TASKLEASE_ROUTER"
ENV_ALLOWED_SERVICE_ACCOUNTS = "TASKLEASE_ALLOWED_SERVICE_ACCOUNTS"
ENV_AUDIENCE = "TASKLEASE_AUDIENCE"
ENV_OIDC_CERTS_URL = "TASKLEASE_OIDC_CERTS_URL"
ENV_OIDC_ISSUERS = "TASKLEASE_OIDC_ISSUERS"
ENV_ALLOW_LOCAL_STORE = "TASKLEASE_ALLOW_LOCAL_STORE"
ENV_DASHBOARD = "TASKLEASE_DASHBOARD"  # The operators' dashboard's path in the worker, if any.
ENV_DASHBOARD_OPERATORS = "TASKLEASE_DASHBOARD_OPERATORS"
ENV_MAX_TASK_BYTES = "TASKLEASE_MAX_TASK_BYTES"  # The largest body the worker reads.
ENV_ASGI_THREADS = "TASKLEASE_ASGI_THREADS"  # Deliveries at once per ASGI worker process.
ENV_DASHBOARD_AUDIENCE = "TASKLEASE_DASHBOARD_AUDIENCE"  # Operators' tokens' own audience.
# Signs the dashboard's CSRF tokens (the name of a variable, not a secret).
ENV_DASHBOARD_SECRET = "TASKLEASE_DASHBOARD_SECRET"  # noqa: S105
# What tasklease.plumbing.otel_setup installs an SDK for: with none set, it installs nothing
# (and the worker does not import it).
ENV_OTEL_SETUP = (
    "TASKLEASE_OTEL",
    "TASKLEASE_METRICS",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
)
ENV_CLOUD_RUN_SERVICE = "K_SERVICE"  # Set by Cloud Run on every instance (docs/platform-facts.md).

# Task and name limits (docs/platform-facts.md).
# Cloud Tasks' maximum task size: 1 MB (cloud.google.com/tasks/docs/quotas, "Maximum task
# size"); the v2 CreateTask proto comment still says 100 KB, an older App Engine limit. A
# worker must accept whatever the queue may deliver: the worker, the producer and the stubs
# all take this one limit (the worker's: TASKLEASE_MAX_TASK_BYTES; the emulator spells
# Google's on its own).
MAX_TASK_BYTES = 1024 * 1024
LARGE_TASK_BYTES = 100 * 1024  # The proto comment's limit: the producer warns above it.
MAX_TASK_HEADER_BYTES = 80 * 1024  # A task's headers, in all; so any one of them at most.
MAX_TASK_NAME_LENGTH = 500
# The longest value of an identity header the worker reads (tasklease's own included: a fan-in
# child's member header); no identity header Google sends comes near it.
MAX_HEADER_VALUE_LENGTH = 1024
MAX_QUEUE_NAME_LENGTH = 100
MAX_JOB_NAME_LENGTH = 500


def rfc3339(moment: datetime, timespec: Literal["auto", "seconds", "microseconds"] = "auto") -> str:
    """``moment`` in UTC as RFC 3339 with a ``Z``: to the microsecond when it has any, or to the
    second (Cloud Scheduler's ``X-CloudScheduler-ScheduleTime``), or always to the microsecond
    (a run key's schedule time, which must never change between versions)."""
    return moment.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def rfc3339_or_none(moment: datetime | None) -> str | None:
    """:func:`rfc3339`, or None for no time (fields of operators' summaries)."""
    return None if moment is None else rfc3339(moment)
