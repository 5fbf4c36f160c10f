"""The transport to Cloud Tasks (or a local emulator) through ``google-cloud-tasks``."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import requests
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tasks_v2

from tasklease.producer import cloud_tasks_batch
from tasklease.producer.cloud_tasks_wire import raise_translated, to_proto
from tasklease.producer.transport import BatchOutcome, TaskRequest, TaskTransport


class CloudTasksTransport(TaskTransport):
    """Creates tasks with ``CloudTasksClient``.

    ``transport`` is ``"grpc"`` (the default against Google) or ``"rest"``. ``endpoint`` points
    at a local emulator (``http://127.0.0.1:8123``): REST with anonymous credentials, as the
    client library has no emulator variable. The client is created lazily, once per process
    (gRPC channels must not cross a fork), and shared by all threads. :meth:`create_tasks`
    sends up to 100 tasks with BatchCreateTasks.
    """

    max_batch_size = cloud_tasks_batch.MAX_BATCH

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
                request={"parent": task.queue_path, "task": to_proto(task)},
                timeout=timeout,
                retry=None,  # The producer retries, with names that make it safe.
            )
        except Exception as exc:
            raise_translated(exc, task)

    def create_tasks(
        self, tasks: Sequence[TaskRequest], request_id: str, timeout: float
    ) -> BatchOutcome:
        return cloud_tasks_batch.create_tasks(self.client, tasks, request_id, timeout)

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
