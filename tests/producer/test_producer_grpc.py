"""The producer over gRPC, against an in-process gRPC server speaking CloudTasks.CreateTask."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

from tasklease.producer import CloudTasksTransport, PermanentEnqueueError, Producer, RetryPolicy


class FakeGrpcCloudTasks:
    def __init__(self) -> None:
        self.tasks: dict[str, tasks_v2.Task] = {}
        self.failures: list[grpc.StatusCode] = []

    def create_task(self, request: tasks_v2.CreateTaskRequest, context: Any) -> tasks_v2.Task:
        if self.failures:
            context.abort(self.failures.pop(0), "injected")
        if request.task.name in self.tasks:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, "Requested entity already exists")
        self.tasks[request.task.name] = request.task
        return request.task


def serve_create_task(fake: FakeGrpcCloudTasks) -> tuple[grpc.Server, int]:
    """A started gRPC server on 127.0.0.1 answering CreateTask with ``fake``, and its port."""
    handler = grpc.method_handlers_generic_handler(
        "google.cloud.tasks.v2.CloudTasks",
        {
            "CreateTask": grpc.unary_unary_rpc_method_handler(
                fake.create_task,
                request_deserializer=tasks_v2.CreateTaskRequest.deserialize,
                response_serializer=tasks_v2.Task.serialize,
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(64))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@pytest.fixture
def grpc_tasks() -> Iterator[tuple[FakeGrpcCloudTasks, int]]:
    fake = FakeGrpcCloudTasks()
    server, port = serve_create_task(fake)
    yield fake, port
    server.stop(None)


def grpc_producer(port: int) -> Producer:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    client = tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))
    return Producer(
        "p",
        "l",
        "q",
        "https://w.example",
        "sa@p.iam.gserviceaccount.com",
        transport=CloudTasksTransport(client=client),
        retry=RetryPolicy(max_attempts=3, initial=0.001, maximum=0.001),
    )


def test_grpc_already_exists_is_a_duplicate(grpc_tasks: tuple[FakeGrpcCloudTasks, int]) -> None:
    fake, port = grpc_tasks
    producer = grpc_producer(port)
    assert producer.enqueue("t", {"a": 1}, key="k").created
    assert not producer.enqueue("t", {"a": 1}, key="k").created
    [task] = fake.tasks.values()
    assert task.http_request.oidc_token.service_account_email == "sa@p.iam.gserviceaccount.com"
    assert task.http_request.body == b'{"a":1}'


def test_grpc_unavailable_and_aborted_are_retried(
    grpc_tasks: tuple[FakeGrpcCloudTasks, int],
) -> None:
    fake, port = grpc_tasks
    fake.failures = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED]
    result = grpc_producer(port).enqueue("t", {}, key="k")
    assert (result.created, result.attempts) == (True, 3)


def test_grpc_not_found_is_permanent(grpc_tasks: tuple[FakeGrpcCloudTasks, int]) -> None:
    fake, port = grpc_tasks
    fake.failures = [grpc.StatusCode.NOT_FOUND]
    with pytest.raises(PermanentEnqueueError, match="not found"):
        grpc_producer(port).enqueue("t", {}, key="k")
