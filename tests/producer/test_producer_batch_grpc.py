"""Batch creates over gRPC against an in-process CloudTasks server whose every answer the test
chooses: per-task statuses, operations that fail part-way or finish later, replayed
``request_id``s. RPCs are counted on the server."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport
from google.longrunning import operations_pb2  # type: ignore[import-untyped]
from google.protobuf import any_pb2
from google.rpc import status_pb2  # type: ignore[import-untyped]

from tasklease.producer import (
    CloudTasksTransport,
    FanOutIncomplete,
    PermanentEnqueueError,
    Producer,
    RetryPolicy,
    task_id,
)

SERVICE = "google.cloud.tasks.v2.CloudTasks"
State = tasks_v2.BatchCreateTasksMetadata.State


class FakeBatchCloudTasks:
    """CreateTask, BatchCreateTasks and GetOperation. ``statuses`` maps a task ID to the status
    its batch reports for it without creating it; ``created_anyway`` task IDs are created yet
    left out of a FAILED operation's answer; ``request_ids`` replays a known id's operation."""

    def __init__(self) -> None:
        self.tasks: dict[str, tasks_v2.Task] = {}
        self.calls: Counter[str] = Counter()
        self.statuses: dict[str, grpc.StatusCode] = {}
        self.create_failures: list[grpc.StatusCode] = []
        self.batch_failure: grpc.StatusCode | None = None
        self.created_anyway: set[str] = set()
        self.pending = False  # Answer an operation not yet done; GetOperation finishes it.
        self.request_ids: dict[str, operations_pb2.Operation] = {}
        self.operations: dict[str, operations_pb2.Operation] = {}

    def create_task(self, request: tasks_v2.CreateTaskRequest, context: Any) -> tasks_v2.Task:
        self.calls["CreateTask"] += 1
        if self.create_failures:
            context.abort(self.create_failures.pop(0), "injected")
        if request.task.name in self.tasks:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, "Requested entity already exists")
        self.tasks[request.task.name] = request.task
        return request.task

    def batch_create(self, request: Any, context: Any) -> operations_pb2.Operation:
        self.calls["BatchCreateTasks"] += 1
        if self.batch_failure is not None:
            context.abort(self.batch_failure, "injected")
        if request.request_id in self.request_ids:
            return self.request_ids[request.request_id]
        created: list[tasks_v2.Task] = []
        failed: dict[int, status_pb2.Status] = {}
        dropped = False
        for index, item in enumerate(request.requests):
            name = item.task.name
            short = name.rsplit("/", 1)[-1]
            if short in self.created_anyway:
                self.tasks[name] = item.task
                dropped = True
            elif short in self.statuses:
                failed[index] = status_pb2.Status(code=self.statuses[short].value[0], message="x")
            elif name in self.tasks:
                failed[index] = status_pb2.Status(code=6, message="Requested entity already exists")
            else:
                self.tasks[name] = item.task
                created.append(item.task)
        state = State.FAILED if dropped else State.PARTIALLY_SUCCEEDED if failed else 2
        metadata = tasks_v2.BatchCreateTasksMetadata(state=state, failed_requests=failed)
        operation = operations_pb2.Operation(
            name=f"operations/{len(self.operations)}", done=not self.pending
        )
        operation.metadata.CopyFrom(_any(metadata))
        if dropped:
            operation.error.CopyFrom(status_pb2.Status(code=13, message="internal"))
        else:
            response = tasks_v2.BatchCreateTasksResponse(tasks=created)
            operation.response.CopyFrom(_any(response))
        self.request_ids[request.request_id] = operation
        self.operations[operation.name] = operation
        if self.pending:
            finished = operations_pb2.Operation()
            finished.CopyFrom(operation)
            finished.done = True
            self.operations[operation.name] = finished
        return operation

    def get_operation(self, request: Any, context: Any) -> operations_pb2.Operation:
        self.calls["GetOperation"] += 1
        return self.operations[request.name]


def _any(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(type(message).pb(message))
    return packed


@pytest.fixture
def fake() -> Iterator[tuple[FakeBatchCloudTasks, int]]:
    fake = FakeBatchCloudTasks()

    def unary(method: Any, request: Any, response: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            method, request_deserializer=request, response_serializer=response
        )

    tasks = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "CreateTask": unary(
                fake.create_task, tasks_v2.CreateTaskRequest.deserialize, tasks_v2.Task.serialize
            ),
            "BatchCreateTasks": unary(
                fake.batch_create,
                tasks_v2.BatchCreateTasksRequest.deserialize,
                operations_pb2.Operation.SerializeToString,
            ),
        },
    )
    operations = grpc.method_handlers_generic_handler(
        "google.longrunning.Operations",
        {
            "GetOperation": unary(
                fake.get_operation,
                operations_pb2.GetOperationRequest.FromString,
                operations_pb2.Operation.SerializeToString,
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers((tasks, operations))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield fake, port
    server.stop(None)


def producer_for(port: int, **overrides: Any) -> Producer:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    client = tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))
    settings: dict[str, Any] = {
        "transport": CloudTasksTransport(client=client),
        "retry": RetryPolicy(max_attempts=2, initial=0.001, maximum=0.001),
    }
    settings.update(overrides)
    return Producer("p", "l", "q", "https://w.example", "sa@p.iam.gserviceaccount.com", **settings)


class Run:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id


def test_a_fan_out_of_10000_children_takes_100_rpcs(
    fake: tuple[FakeBatchCloudTasks, int],
) -> None:
    server, port = fake
    items = [(f"customer-{n}", {"customer": n}) for n in range(10_000)]
    results = producer_for(port).fan_out(Run("r" * 64), "send_report", items)
    assert sum(result.created for result in results) == 10_000
    assert server.calls == {"BatchCreateTasks": 100}
    assert len(server.tasks) == 10_000


def test_each_task_of_a_batch_ends_as_its_own_create_would(
    fake: tuple[FakeBatchCloudTasks, int],
) -> None:
    server, port = fake
    producer = producer_for(port)
    producer.enqueue("t", {}, key="taken")
    server.statuses = {
        task_id("t", "bad"): grpc.StatusCode.INVALID_ARGUMENT,
        task_id("t", "flaky"): grpc.StatusCode.UNAVAILABLE,  # Uncertain: created on its own.
    }
    server.calls.clear()
    results = producer.enqueue_many("t", [(k, {}) for k in ("new", "taken", "bad", "flaky")])
    assert [r.created for r in results] == [True, False, False, True]
    assert isinstance(results[2].error, PermanentEnqueueError)
    assert "refused" in str(results[2].error)
    assert results[3].attempts == 2  # The batch, then its own create.
    assert server.calls == {"BatchCreateTasks": 1, "CreateTask": 1}


def test_an_operation_that_failed_part_way_leaves_the_unreported_tasks_to_single_creates(
    fake: tuple[FakeBatchCloudTasks, int],
) -> None:
    server, port = fake
    producer = producer_for(port)
    server.created_anyway = {task_id("t", "b")}  # Created, yet the FAILED answer lists nothing.
    results = producer.enqueue_many("t", [("a", {}), ("b", {}), ("c", {})])
    # ALREADY_EXISTS after this call's own batch counts as created, as after a lost answer.
    assert [(r.created, r.attempts, r.ok) for r in results] == [(True, 2, True)] * 3
    assert server.calls == {"BatchCreateTasks": 1, "CreateTask": 3}
    assert len(server.tasks) == 3


def test_an_operation_not_yet_done_is_polled(fake: tuple[FakeBatchCloudTasks, int]) -> None:
    server, port = fake
    server.pending = True
    results = producer_for(port).enqueue_many("t", [("a", {}), ("b", {})])
    assert [r.created for r in results] == [True, True]
    assert server.calls["BatchCreateTasks"] == 1 and server.calls["CreateTask"] == 0
    assert server.calls["GetOperation"] >= 1


def test_a_fan_out_retry_reports_exactly_the_children_it_created(
    fake: tuple[FakeBatchCloudTasks, int],
) -> None:
    """The retry's batches hold the same names; were their request_id the same too, the
    server would answer the first run's operation and every child would look created."""
    server, port = fake
    producer = producer_for(port, retry=RetryPolicy(max_attempts=1))
    run = Run("f" * 64)
    items = [(f"c{n}", {"n": n}) for n in range(5)]
    missing = task_id("send", f"{run.run_id}/c2")
    server.statuses = {missing: grpc.StatusCode.UNAVAILABLE}
    server.create_failures = [grpc.StatusCode.UNAVAILABLE]  # Its single create fails too.
    with pytest.raises(FanOutIncomplete) as raised:
        producer.fan_out(run, "send", items)
    assert raised.value.failed_keys == ["c2"]
    server.statuses = {}
    retry = producer.fan_out(run, "send", items)
    assert [r.created for r in retry] == [False, False, True, False, False]
    assert len(server.tasks) == 5


def test_permission_denied_on_a_batch_names_the_role_and_the_way_back_to_single_creates(
    fake: tuple[FakeBatchCloudTasks, int],
) -> None:
    server, port = fake
    server.batch_failure = grpc.StatusCode.PERMISSION_DENIED
    results = producer_for(port).enqueue_many("t", [("a", {}), ("b", {})])
    message = str(results[0].error)
    assert not any(r.ok for r in results)
    assert "BatchCreateTasks" in message and "roles/cloudtasks.enqueuer" in message
    assert "Producer(batch=False)" in message
    assert "roles/iam.serviceAccountUser on sa@p.iam.gserviceaccount.com" in message
    single = producer_for(port, batch=False).enqueue_many("t", [("a", {}), ("b", {})])
    assert all(r.created for r in single)
