"""The transport to Cloud Tasks (or a local emulator) through ``google-cloud-tasks``."""

from __future__ import annotations

import os
import threading
from typing import Any

import requests
from google.api_core import exceptions as api
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tasks_v2
from google.protobuf import duration_pb2, timestamp_pb2

from tasklease.producer.errors import (
    PermanentEnqueueError,
    TaskAlreadyExists,
    TransientEnqueueError,
)
from tasklease.producer.transport import TaskRequest, TaskTransport

# Errors worth retrying (platform-facts.md: UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED,
# 5xx; ABORTED is a Conflict subclass but must be retried, not taken for a duplicate).
_TRANSIENT: tuple[type[BaseException], ...] = (
    api.ServerError,
    api.TooManyRequests,
    api.DeadlineExceeded,
    api.Aborted,
    api.RetryError,
    requests.ConnectionError,
    requests.Timeout,
)


class CloudTasksTransport(TaskTransport):
    """Creates tasks with ``CloudTasksClient``.

    ``transport`` is ``"grpc"`` (the default against Google) or ``"rest"``. ``endpoint`` points
    at a local emulator (``http://127.0.0.1:8123``): REST with anonymous credentials, as the
    client library has no emulator variable. The client is created lazily, once per process
    (gRPC channels must not cross a fork), and shared by all threads.
    """

    def __init__(
        self,
        *,
        transport: str | None = None,
        endpoint: str | None = None,
        client: Any = None,
        pool_size: int = 64,
    ) -> None:
        if endpoint and transport == "grpc":
            raise ValueError("a local endpoint is reached over REST: use transport='rest'")
        self._transport = transport or ("rest" if endpoint else "grpc")
        self._endpoint = endpoint
        self._pool_size = pool_size
        self._client = client
        self._client_pid = os.getpid() if client is not None else None
        self._lock = threading.Lock()

    def create_task(self, task: TaskRequest, timeout: float) -> None:
        try:
            self.client.create_task(
                request={"parent": task.queue_path, "task": _to_proto(task)},
                timeout=timeout,
                retry=None,  # The producer retries, with names that make it safe.
            )
        except api.AlreadyExists as exc:
            raise TaskAlreadyExists(str(exc)) from exc
        except api.Aborted as exc:  # A Conflict subclass, yet worth retrying.
            raise TransientEnqueueError(f"Aborted: {exc}") from exc
        except api.Conflict as exc:
            # REST answers 409 for ALREADY_EXISTS and for ABORTED alike; the status tells.
            if _rest_status(exc) == "ABORTED":
                raise TransientEnqueueError(str(exc)) from exc
            raise TaskAlreadyExists(str(exc)) from exc
        except _TRANSIENT as exc:
            raise TransientEnqueueError(f"{type(exc).__name__}: {exc}") from exc
        except api.NotFound as exc:
            raise PermanentEnqueueError(_queue_not_found(task, exc)) from exc
        except api.Forbidden as exc:  # PermissionDenied over gRPC, 403 over REST.
            raise PermanentEnqueueError(
                "permission denied: the caller needs roles/cloudtasks.enqueuer on the queue"
                + (
                    f" and roles/iam.serviceAccountUser on {task.service_account}"
                    if task.service_account
                    else ""
                )
                + f" ({exc})"
            ) from exc
        except api.GoogleAPICallError as exc:
            # Cloud Tasks answers a missing queue with FAILED_PRECONDITION, not NOT_FOUND.
            if (
                isinstance(exc, api.FailedPrecondition)
                or _rest_status(exc) == "FAILED_PRECONDITION"
            ):
                raise PermanentEnqueueError(_queue_not_found(task, exc)) from exc
            raise PermanentEnqueueError(f"Cloud Tasks refused the task: {exc}") from exc

    @property
    def client(self) -> Any:
        """The process's ``CloudTasksClient``, created on first use (and again after a fork)."""
        if self._client is None or self._client_pid != os.getpid():
            with self._lock:
                if self._client is None or self._client_pid != os.getpid():
                    self._client = self._new_client()
                    self._client_pid = os.getpid()
        return self._client

    def close(self) -> None:
        if self._client is not None and self._client_pid == os.getpid():
            self._client.transport.close()
        self._client = None

    def _new_client(self) -> Any:
        if not self._endpoint:
            return tasks_v2.CloudTasksClient(transport=self._transport)
        client = tasks_v2.CloudTasksClient(
            transport="rest",
            client_options=ClientOptions(api_endpoint=self._endpoint),
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        )
        _tune_local_session(client, self._pool_size)
        return client


def _tune_local_session(client: Any, size: int) -> None:
    """Adjust the REST transport's session for a local endpoint.

    It keeps 10 connections, and concurrent enqueues need more; and it reads proxy settings
    from the environment on every request (a measurable share of each create's CPU time),
    which a loopback endpoint never needs. The transport has no options for either.
    """
    session = getattr(client.transport, "_session", None)
    if isinstance(session, requests.Session):
        session.trust_env = False
        adapter = requests.adapters.HTTPAdapter(pool_connections=size, pool_maxsize=size)
        session.mount("http://", adapter)
        session.mount("https://", adapter)


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


def _to_proto(task: TaskRequest) -> tasks_v2.Task:
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
