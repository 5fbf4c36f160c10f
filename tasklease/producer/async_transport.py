"""The async producer's plug-in point, and its transport on ``CloudTasksAsyncClient``.

The contract is :class:`~tasklease.producer.transport.TaskTransport`'s (one attempt, the
same exceptions), with coroutines: an implementation must never block the event loop.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import grpc
from google.api_core import exceptions as api
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcAsyncIOTransport

from tasklease.producer import cloud_tasks_batch
from tasklease.producer.cloud_tasks_wire import raise_translated, to_proto
from tasklease.producer.transport import BatchOutcome, TaskRequest


class AsyncTaskTransport(ABC):
    """Creates tasks without blocking the loop: :meth:`create_task` (and, for batches,
    :meth:`create_tasks`), as :class:`~tasklease.producer.TaskTransport` does."""

    # The most tasks :meth:`create_tasks` takes at once; 0: it is not implemented.
    max_batch_size: ClassVar[int] = 0

    @abstractmethod
    async def create_task(self, task: TaskRequest, timeout: float) -> None:
        """Create ``task``, waiting at most ``timeout`` seconds."""

    async def create_tasks(
        self, tasks: Sequence[TaskRequest], request_id: str, timeout: float
    ) -> BatchOutcome:
        """Create ``tasks`` (one queue, at most :attr:`max_batch_size`) in one attempt."""
        raise NotImplementedError(f"{type(self).__name__} creates tasks one at a time")

    async def close(self) -> None:  # noqa: B027 - optional hook.
        """Release connections."""


class CloudTasksAsyncTransport(AsyncTaskTransport):
    """Creates tasks with ``CloudTasksAsyncClient`` over ``grpc_asyncio`` (the client
    library's only async transport).

    ``endpoint`` (``host:port``) points at a local emulator's gRPC port, over an insecure
    channel; without it, Google's endpoint with application default credentials. The client
    is made on first use, inside the running loop (a grpc.aio channel belongs to the loop that
    made it). :meth:`create_tasks` sends up to 100 tasks with BatchCreateTasks and awaits its
    operation, as :class:`~tasklease.producer.CloudTasksTransport` does.
    """

    max_batch_size = cloud_tasks_batch.MAX_BATCH

    def __init__(self, *, endpoint: str | None = None, client: Any = None) -> None:
        if endpoint is not None and endpoint.startswith(("http://", "https://")):
            raise ValueError(
                f"the async producer reaches an emulator over gRPC: give host:port (the "
                f"emulator's gRPC port), not {endpoint!r}"
            )
        self._endpoint = endpoint
        self._client = client

    @property
    def client(self) -> Any:
        """The ``CloudTasksAsyncClient``, made on first use."""
        if self._client is None:
            self._client = self._new_client()
        return self._client

    async def create_task(self, task: TaskRequest, timeout: float) -> None:
        try:
            await self.client.create_task(
                request={"parent": task.queue_path, "task": to_proto(task)},
                timeout=timeout,
                retry=None,  # The producer retries, with names that make it safe.
            )
        except Exception as exc:
            raise_translated(exc, task)

    async def create_tasks(
        self, tasks: Sequence[TaskRequest], request_id: str, timeout: float
    ) -> BatchOutcome:
        """One BatchCreateTasks call (waiting for its operation at most ``timeout`` more)."""
        request = cloud_tasks_batch.batch_request(tasks, request_id)
        try:
            future = await self.client.batch_create_tasks(
                request=request, timeout=timeout, retry=None
            )
        except Exception as exc:
            raise_translated(exc, tasks[0], batch=True)
        if not future.operation.done:
            # Polls GetOperation; an operation that ends in an error raises, its metadata stays.
            with contextlib.suppress(api.GoogleAPICallError, TimeoutError):
                await future.result(timeout=timeout)
        return cloud_tasks_batch.outcome(future.operation, tasks)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.transport.close()
        self._client = None

    def _new_client(self) -> Any:
        if not self._endpoint:
            return tasks_v2.CloudTasksAsyncClient()
        channel = grpc.aio.insecure_channel(self._endpoint)
        return tasks_v2.CloudTasksAsyncClient(
            transport=CloudTasksGrpcAsyncIOTransport(channel=channel)
        )
