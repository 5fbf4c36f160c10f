"""Between TaskRequest and google-cloud-tasks: the task proto, and what an API error means."""

from __future__ import annotations

from typing import NoReturn

import requests
from google.api_core import exceptions as api
from google.cloud import tasks_v2
from google.protobuf import duration_pb2, timestamp_pb2

from tasklease.producer.errors import (
    EnqueueError,
    PermanentEnqueueError,
    TaskAlreadyExists,
    TransientEnqueueError,
)
from tasklease.producer.transport import TaskRequest

# Errors worth retrying (docs/platform-facts.md: UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED,
# 5xx; ABORTED is a Conflict subclass but must be retried, not taken for a duplicate; CANCELLED,
# a ClientError, says the call was cut off, not that the task is wrong:
# https://grpc.github.io/grpc/core/md_doc_statuscodes.html).
_TRANSIENT: tuple[type[BaseException], ...] = (
    api.ServerError,
    api.TooManyRequests,
    api.DeadlineExceeded,
    api.Aborted,
    api.Cancelled,
    api.RetryError,
    requests.ConnectionError,
    requests.Timeout,
)
# docs/platform-facts.md, "Cloud Tasks: BatchCreateTasks": Google's roles page lists no
# permission of its own for a batch; cloudtasks.tasks.create is in roles/cloudtasks.enqueuer.
BATCH_PERMISSION_HINT = (
    "BatchCreateTasks needs cloudtasks.tasks.create on the queue (roles/cloudtasks.enqueuer), "
    "like CreateTask, as far as Google's roles page tells; if single creates work for this "
    "account, use Producer(batch=False) (TASKLEASE_BATCH=0)"
)


def translate(exc: BaseException, task: TaskRequest, *, batch: bool = False) -> EnqueueError | None:
    """The producer's error for a client-library error about ``task`` (or its batch); None for
    an exception that is not an API answer."""
    if isinstance(exc, api.AlreadyExists):
        return TaskAlreadyExists(str(exc))
    if isinstance(exc, api.Aborted):  # A Conflict subclass, yet worth retrying.
        return TransientEnqueueError(f"Aborted: {exc}")
    if isinstance(exc, api.Conflict):
        # REST answers 409 for ALREADY_EXISTS and for ABORTED alike; the status tells.
        if _rest_status(exc) == "ABORTED":
            return TransientEnqueueError(str(exc))
        return TaskAlreadyExists(str(exc))
    if isinstance(exc, _TRANSIENT):
        return TransientEnqueueError(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, api.NotFound):
        return PermanentEnqueueError(_queue_not_found(task, exc))
    if isinstance(exc, api.Forbidden):  # PermissionDenied over gRPC, 403 over REST.
        account = (
            f" and roles/iam.serviceAccountUser on {task.service_account}"
            if task.service_account
            else ""
        )
        if batch:
            return PermanentEnqueueError(
                f"permission denied on BatchCreateTasks: {BATCH_PERMISSION_HINT}; the tasks "
                f"also need{account or ' nothing more'} ({exc})"
            )
        return PermanentEnqueueError(
            f"permission denied: the caller needs roles/cloudtasks.enqueuer on the queue{account}"
            f" ({exc})"
        )
    if isinstance(exc, api.GoogleAPICallError):
        # Cloud Tasks answers a missing queue with FAILED_PRECONDITION, not NOT_FOUND.
        if isinstance(exc, api.FailedPrecondition) or _rest_status(exc) == "FAILED_PRECONDITION":
            return PermanentEnqueueError(_queue_not_found(task, exc))
        return PermanentEnqueueError(f"Cloud Tasks refused the task: {exc}")
    return None


def raise_translated(exc: Exception, task: TaskRequest, *, batch: bool = False) -> NoReturn:
    """Raise the producer's error for an API error about ``task`` (or its batch), from it;
    raise ``exc`` itself when it is not an API answer."""
    error = translate(exc, task, batch=batch)
    if error is None:
        raise exc
    raise error from exc


def _queue_not_found(task: TaskRequest, error: api.GoogleAPICallError) -> str:
    return (
        f"queue {task.queue_path} not found: create it (gcloud tasks queues create) "
        f"or fix the project/location/queue settings ({error})"
    )


def _rest_status(error: api.GoogleAPICallError) -> str | None:
    response = getattr(error, "response", None)
    try:
        status = response.json()["error"]["status"]  # type: ignore[union-attr]
    except Exception:
        return None
    return status if isinstance(status, str) else None


def to_proto(task: TaskRequest) -> tasks_v2.Task:
    http_request = tasks_v2.HttpRequest(
        url=task.url,
        http_method=tasks_v2.HttpMethod.POST,
        headers=task.headers,
        body=task.body,
    )
    if task.service_account:
        http_request.oidc_token = tasks_v2.OidcToken(
            service_account_email=task.service_account, audience=task.audience or ""
        )
    proto = tasks_v2.Task(name=task.name, http_request=http_request)
    if task.schedule_time is not None:
        stamp = timestamp_pb2.Timestamp()
        stamp.FromDatetime(task.schedule_time)
        proto.schedule_time = stamp
    if task.dispatch_deadline is not None:
        deadline = duration_pb2.Duration()
        deadline.FromTimedelta(task.dispatch_deadline)
        proto.dispatch_deadline = deadline
    return proto
