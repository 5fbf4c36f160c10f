"""The worker's own rules: the headers Google sends, leases, retention, clock skew, result sizes.

What producer, worker, stubs, CLI and deploy kit share (tasklease's headers, routes,
environment variables, task size limits, time format) is :mod:`tasklease.protocol`.
"""

from __future__ import annotations

from datetime import timedelta

from tasklease import protocol

# Cloud Tasks HTTP-target headers (docs/platform-facts.md, "what an HTTP target receives").
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

DEFAULT_STORE_URL = "sqlite:///tasklease-runs.db"

# Limits taken from the platform (docs/platform-facts.md); task sizes are in tasklease.protocol.
MAX_HEADER_VALUE_LENGTH = protocol.MAX_HEADER_VALUE_LENGTH

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
# (`gcloud scheduler jobs run` sends the *next* slot's time, well before it):
# docs/platform-facts.md.
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
