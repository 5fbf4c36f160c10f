"""Every header name, environment variable, limit and default of the worker, in one place."""

from __future__ import annotations

from datetime import timedelta

# Cloud Tasks HTTP-target headers (platform-facts.md, "what an HTTP target receives").
# Header lookups are case-insensitive: HTTP/2 front ends (Cloud Run) lower-case them.
TASKS_QUEUE_NAME = "X-CloudTasks-QueueName"
TASKS_TASK_NAME = "X-CloudTasks-TaskName"
TASKS_RETRY_COUNT = "X-CloudTasks-TaskRetryCount"
TASKS_EXECUTION_COUNT = "X-CloudTasks-TaskExecutionCount"
TASKS_ETA = "X-CloudTasks-TaskETA"
TASKS_PREVIOUS_RESPONSE = "X-CloudTasks-TaskPreviousResponse"
TASKS_RETRY_REASON = "X-CloudTasks-TaskRetryReason"

# Cloud Scheduler headers. ScheduleTime is only sent for unix-cron schedules.
SCHEDULER_JOB_NAME = "X-CloudScheduler-JobName"
SCHEDULER_SCHEDULE_TIME = "X-CloudScheduler-ScheduleTime"

# Neither service sends a project or region: the target configures these (headers or query).
PROJECT_HEADER = "X-Tasklease-Project"
LOCATION_HEADER = "X-Tasklease-Location"
PROJECT_QUERY = "project"
LOCATION_QUERY = "location"

# Response headers of the worker.
OUTCOME_HEADER = "X-Tasklease-Outcome"
RUN_ID_HEADER = "X-Tasklease-Run-Id"

# Routes.
TASK_ROUTE_PREFIX = "/tasks/"
SCHEDULER_ROUTE_PREFIX = "/jobs/"

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
ENV_DASHBOARD_AUDIENCE = "TASKLEASE_DASHBOARD_AUDIENCE"  # Operators' tokens' own audience.
# Signs the dashboard's CSRF tokens (the name of a variable, not a secret).
ENV_DASHBOARD_SECRET = "TASKLEASE_DASHBOARD_SECRET"  # noqa: S105
ENV_CLOUD_RUN_SERVICE = "K_SERVICE"  # Set by Cloud Run on every instance (platform-facts.md).
# What tasklease.worker.otel_setup installs an SDK for: with none set, it installs nothing.
ENV_OTEL_SETUP = (
    "TASKLEASE_OTEL",
    "TASKLEASE_METRICS",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
)

DEFAULT_STORE_URL = "sqlite:///tasklease-runs.db"

# Limits taken from the platform (platform-facts.md).
# Cloud Tasks' maximum task size: 1 MB (cloud.google.com/tasks/docs/quotas, "Maximum task
# size"); the v2 CreateTask proto comment still says 100 KB, an older App Engine limit. A
# worker must accept whatever the queue may deliver: the worker, the producer, the stubs and
# the emulator all take this one limit (the worker's: TASKLEASE_MAX_TASK_BYTES).
MAX_TASK_BYTES = 1024 * 1024
MAX_BODY_BYTES = MAX_TASK_BYTES  # The worker's default limit on a delivery's body.
LARGE_TASK_BYTES = 100 * 1024  # The proto comment's limit: the producer warns above it.
MAX_TASK_NAME_LENGTH = 500
MAX_QUEUE_NAME_LENGTH = 100
MAX_JOB_NAME_LENGTH = 500
MAX_HEADER_VALUE_LENGTH = 1024  # No identity header Google sends comes near this.

# Per-handler defaults.
DEFAULT_LEASE = timedelta(minutes=5)
DEFAULT_RETENTION = timedelta(days=7)  # Must outlive the queue's retry window.
MIN_LEASE = timedelta(seconds=1)

# The largest disagreement between two instances' wall clocks that the lease tolerates: an
# expired lease is taken over only once the taker's clock is this far past its expiry, so an
# instance whose clock runs up to this much ahead cannot start a run its holder still runs.
# Cloud Run instances are NTP-synchronised to well under this.
MAX_CLOCK_SKEW = timedelta(seconds=1)

# A scheduler delivery whose schedule time is this far after its arrival is a manual run
# (`gcloud scheduler jobs run` sends the *next* slot's time, well before it): platform-facts.md.
DEFAULT_MANUAL_RUN_MARGIN = timedelta(seconds=60)

# Stored result and error text are capped so records stay small (Firestore documents: 1 MiB).
MAX_RESULT_BYTES = 32 * 1024
MAX_ERROR_CHARS = 4 * 1024

# Retry-After (seconds) at most for a delivery whose lock (exclusive job, concurrency key) is
# held by a live run: that run may end at any moment, and its lease could run for minutes.
LOCK_BUSY_RETRY_AFTER_MAX = 10
MAX_CONCURRENCY_KEY_LENGTH = 500
# A lock's fencing token is at least its grant's time in microseconds (locking.next_token), and
# a lock record is deleted (purge, TTL) no sooner than this after the time its token stands
# for: a later grant on a fresh record then outranks it while the clocks of the instances
# agree within this, sixty times what the lease already assumes.
LOCK_TOKEN_MARGIN = timedelta(minutes=1)

# Seconds a client should wait before retrying when the store is down.
STORE_UNAVAILABLE_RETRY_AFTER = 5

# Seconds each connect and each read of an OIDC public key fetch may take.
FETCH_TIMEOUT_SECONDS = 3.0
