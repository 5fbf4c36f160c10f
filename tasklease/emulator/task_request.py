"""The HTTP request one attempt of a task sends: its route (the queue's overrides applied),
the headers Cloud Tasks sets on every HTTP-target request (docs/platform-facts.md) in place of any
the task set itself (:mod:`tasklease.emulator.headers`), its OIDC token and its deadline."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tasklease.emulator import model
from tasklease.emulator.headers import TASKS_USER_AGENT, set_header, task_headers
from tasklease.emulator.oidc import TokenIssuer
from tasklease.emulator.routing import route
from tasklease.emulator.rows import TaskRow
from tasklease.emulator.sender import AttemptResult


@dataclass(frozen=True)
class TaskRequest:
    """The HTTP request of one attempt."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes
    deadline: float


def task_request(row: TaskRow, config: dict[str, Any], issuer: TokenIssuer) -> TaskRequest:
    """The request of ``row``'s next attempt in the queue ``config``."""
    request = route(row.spec["httpRequest"], config.get("httpTarget"))
    url = request.url
    headers = task_headers(request.headers)
    headers["User-Agent"] = TASKS_USER_AGENT
    headers["X-CloudTasks-QueueName"] = row.queue.rsplit("/", 1)[-1]
    headers["X-CloudTasks-TaskName"] = row.name.rsplit("/", 1)[-1]
    headers["X-CloudTasks-TaskRetryCount"] = str(row.dispatch_count)
    headers["X-CloudTasks-TaskExecutionCount"] = str(row.execution_count)
    headers["X-CloudTasks-TaskETA"] = f"{row.schedule_us / 1e6:.6f}"
    # Only on a retry of an attempt that got an answer; the reason is empty for HTTP
    # targets (captured from production: aertje/cloud-tasks-emulator#114).
    if row.previous_response is not None:
        headers["X-CloudTasks-TaskPreviousResponse"] = str(row.previous_response)
    if row.retry_reason is not None:
        headers["X-CloudTasks-TaskRetryReason"] = row.retry_reason
    if request.service_account:
        token = issuer.mint(request.service_account, request.audience or url)
        set_header(headers, "Authorization", f"Bearer {token}")
    deadline = model.seconds_of(row.spec.get("dispatchDeadline"), model.DEFAULT_DISPATCH_DEADLINE)
    return TaskRequest(request.method, url, headers, request.body, deadline)


def unsent(error: Exception) -> AttemptResult:
    """The result of an attempt that could not be sent (a header http.client refuses, say):
    a failed attempt like any other, which the queue's retry policy counts."""
    now = time.time_ns() // 1000
    text = f"not sent: {type(error).__name__}: {error}"[:300]
    return AttemptResult(None, None, text, None, now, now)
