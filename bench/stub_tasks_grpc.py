"""A minimal Cloud Tasks gRPC endpoint for CreateTask and BatchCreateTasks (benchmark helper,
its own process).

gRPC is the client library's default transport against Google. Like stub_tasks_api.py it
answers like the real API (the task back, ALREADY_EXISTS for a known name; a done operation
for a batch) after an optional latency per call, and does nothing else.

    python bench/stub_tasks_grpc.py PORT [LATENCY_MS]
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent import futures
from typing import Any

import grpc
from google.cloud import tasks_v2
from google.longrunning import operations_pb2  # type: ignore[import-untyped]
from google.rpc import status_pb2  # type: ignore[import-untyped]

_names: set[str] = set()
_lock = threading.Lock()


def serve(port: int, latency: float) -> None:
    def create_task(request: tasks_v2.CreateTaskRequest, context: Any) -> tasks_v2.Task:
        time.sleep(latency)
        with _lock:
            duplicate = request.task.name in _names
            _names.add(request.task.name)
        if duplicate:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, "Requested entity already exists")
        return request.task

    def batch_create(request: Any, context: Any) -> operations_pb2.Operation:
        time.sleep(latency)
        created: list[tasks_v2.Task] = []
        failed: dict[int, status_pb2.Status] = {}
        with _lock:
            for index, item in enumerate(request.requests):
                if item.task.name in _names:
                    failed[index] = status_pb2.Status(code=6, message="already exists")
                else:
                    _names.add(item.task.name)
                    created.append(tasks_v2.Task(name=item.task.name))
        state = 5 if failed else 2  # PARTIALLY_SUCCEEDED, SUCCEEDED
        metadata = tasks_v2.BatchCreateTasksMetadata(state=state, failed_requests=failed)
        operation = operations_pb2.Operation(name="operations/stub", done=True)
        operation.metadata.Pack(tasks_v2.BatchCreateTasksMetadata.pb(metadata))
        response = tasks_v2.BatchCreateTasksResponse(tasks=created)
        operation.response.Pack(tasks_v2.BatchCreateTasksResponse.pb(response))
        return operation

    handler = grpc.method_handlers_generic_handler(
        "google.cloud.tasks.v2.CloudTasks",
        {
            "CreateTask": grpc.unary_unary_rpc_method_handler(
                create_task,
                request_deserializer=tasks_v2.CreateTaskRequest.deserialize,
                response_serializer=tasks_v2.Task.serialize,
            ),
            "BatchCreateTasks": grpc.unary_unary_rpc_method_handler(
                batch_create,
                request_deserializer=tasks_v2.BatchCreateTasksRequest.deserialize,
                response_serializer=operations_pb2.Operation.SerializeToString,
            ),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(128))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


if __name__ == "__main__":
    serve(int(sys.argv[1]), float(sys.argv[2]) / 1000 if len(sys.argv) > 2 else 0.0)
