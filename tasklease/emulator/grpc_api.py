"""The Cloud Tasks v2 API over gRPC: the client library's default transport.

Requests and responses are the message classes of ``google-cloud-tasks`` itself (and of
``google.cloud.location`` for ListLocations), no hand-copied protos. Each call converts its
request to the REST JSON that :class:`~tasklease.emulator.api.CloudTasksApi` takes, so gRPC and REST
share one model, one validation and one database, and errors carry the same status codes.
The server listens on loopback only: gRPC has no Host header for the guard to check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from google.cloud import tasks_v2
from google.cloud.location import locations_pb2
from google.iam.v1 import iam_policy_pb2, policy_pb2
from google.protobuf import empty_pb2, json_format

from tasklease.emulator import model
from tasklease.emulator.api import CloudTasksApi, create_second_us
from tasklease.emulator.model import ApiError

SERVICE = "google.cloud.tasks.v2.CloudTasks"
LOCATIONS_SERVICE = "google.cloud.location.Locations"
LOOPBACK = "127.0.0.1"

Handler = Callable[[CloudTasksApi, dict[str, Any]], dict[str, Any]]


def _pb(message: Any) -> Any:
    """The raw protobuf class behind a proto-plus message class."""
    return message.pb()


# method: (request class, response class, what it does with the request as REST JSON).
_TASKS_METHODS: dict[str, tuple[Any, Any, Handler]] = {
    "ListQueues": (
        _pb(tasks_v2.ListQueuesRequest),
        _pb(tasks_v2.ListQueuesResponse),
        lambda api, r: api.list_queues(
            r["parent"], r.get("pageSize", 0), r.get("pageToken", ""), r.get("filter", "")
        ),
    ),
    "GetQueue": (
        _pb(tasks_v2.GetQueueRequest),
        _pb(tasks_v2.Queue),
        lambda api, r: api.get_queue(r.get("name", "")),
    ),
    "CreateQueue": (
        _pb(tasks_v2.CreateQueueRequest),
        _pb(tasks_v2.Queue),
        lambda api, r: api.create_queue(r.get("parent", ""), r.get("queue", {})),
    ),
    "UpdateQueue": (
        _pb(tasks_v2.UpdateQueueRequest),
        _pb(tasks_v2.Queue),
        lambda api, r: api.update_queue(
            r.get("queue", {}).get("name", ""), r.get("queue", {}), r.get("updateMask")
        ),
    ),
    "DeleteQueue": (
        _pb(tasks_v2.DeleteQueueRequest),
        empty_pb2.Empty,
        lambda api, r: api.delete_queue(r.get("name", "")),
    ),
    "PurgeQueue": (
        _pb(tasks_v2.PurgeQueueRequest),
        _pb(tasks_v2.Queue),
        lambda api, r: api.change_queue(r.get("name", ""), "purge"),
    ),
    "PauseQueue": (
        _pb(tasks_v2.PauseQueueRequest),
        _pb(tasks_v2.Queue),
        lambda api, r: api.change_queue(r.get("name", ""), "pause"),
    ),
    "ResumeQueue": (
        _pb(tasks_v2.ResumeQueueRequest),
        _pb(tasks_v2.Queue),
        lambda api, r: api.change_queue(r.get("name", ""), "resume"),
    ),
    "GetIamPolicy": (
        iam_policy_pb2.GetIamPolicyRequest,
        policy_pb2.Policy,
        lambda api, r: api.get_iam_policy(r.get("resource", "")),
    ),
    "SetIamPolicy": (
        iam_policy_pb2.SetIamPolicyRequest,
        policy_pb2.Policy,
        lambda api, r: api.set_iam_policy(r.get("resource", ""), r),
    ),
    "TestIamPermissions": (
        iam_policy_pb2.TestIamPermissionsRequest,
        iam_policy_pb2.TestIamPermissionsResponse,
        lambda api, r: api.test_iam_permissions(r.get("resource", ""), r),
    ),
    "ListTasks": (
        _pb(tasks_v2.ListTasksRequest),
        _pb(tasks_v2.ListTasksResponse),
        lambda api, r: api.list_tasks(
            r.get("parent", ""),
            r.get("pageSize", 0),
            r.get("pageToken", ""),
            r.get("responseView", "BASIC"),
        ),
    ),
    "GetTask": (
        _pb(tasks_v2.GetTaskRequest),
        _pb(tasks_v2.Task),
        lambda api, r: api.get_task(r.get("name", ""), r.get("responseView", "BASIC")),
    ),
    "DeleteTask": (
        _pb(tasks_v2.DeleteTaskRequest),
        empty_pb2.Empty,
        lambda api, r: api.delete_task(r.get("name", "")),
    ),
    "RunTask": (
        _pb(tasks_v2.RunTaskRequest),
        _pb(tasks_v2.Task),
        lambda api, r: api.run_task(r.get("name", ""), r.get("responseView", "BASIC")),
    ),
}

_LOCATIONS_METHODS: dict[str, tuple[Any, Any, Handler]] = {
    "ListLocations": (
        locations_pb2.ListLocationsRequest,
        locations_pb2.ListLocationsResponse,
        lambda api, r: api.list_locations(r.get("name", "").removeprefix("projects/")),
    ),
    "GetLocation": (
        locations_pb2.GetLocationRequest,
        locations_pb2.Location,
        lambda api, r: _get_location(api, r.get("name", "")),
    ),
}


def _get_location(api: CloudTasksApi, name: str) -> dict[str, Any]:
    parts = name.split("/")
    if len(parts) != 4 or parts[0] != "projects" or parts[2] != "locations":
        raise ApiError(400, f"invalid location name {name!r}")
    return api.get_location(parts[1], parts[3])


def unary_method(api: Any, request_class: Any, response_class: Any, handle: Any) -> Any:
    """A unary method: ``handle(api, request as REST JSON)`` answers REST JSON, or raises
    :class:`ApiError`, answered as its status code."""

    def call(request: Any, context: grpc.ServicerContext) -> Any:
        body = json_format.MessageToDict(request)
        try:
            result = handle(api, body)
        except ApiError as exc:
            context.abort(_status_code(exc), exc.message)
        return json_format.ParseDict(result, response_class(), ignore_unknown_fields=True)

    return grpc.unary_unary_rpc_method_handler(
        call,
        request_deserializer=request_class.FromString,
        response_serializer=response_class.SerializeToString,
    )


def _create_task(api: CloudTasksApi) -> Any:
    """CreateTask, the hot path: the request message is validated as it is, and the answer is
    the request's task with what the service sets, with no JSON in between."""
    task_class = _pb(tasks_v2.Task)

    def call(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            row, view = api.create_task_message(request)
        except ApiError as exc:
            context.abort(_status_code(exc), exc.message)
        task = task_class()
        task.CopyFrom(request.task)  # Output-only fields already cleared.
        task.name = row.name
        task.schedule_time.FromMicroseconds(row.schedule_us)
        task.create_time.FromMicroseconds(create_second_us(row))
        if not task.HasField("dispatch_deadline"):
            task.dispatch_deadline.FromNanoseconds(int(model.DEFAULT_DISPATCH_DEADLINE * 1e9))
        if not task.http_request.http_method:
            task.http_request.http_method = tasks_v2.HttpMethod.POST
        task.view = 2 if view == "FULL" else 1  # Task.View FULL or BASIC.
        if view != "FULL":
            task.http_request.ClearField("body")
        return task

    return grpc.unary_unary_rpc_method_handler(
        call,
        request_deserializer=_pb(tasks_v2.CreateTaskRequest).FromString,
        response_serializer=task_class.SerializeToString,
    )


def _status_code(error: ApiError) -> grpc.StatusCode:
    try:
        return grpc.StatusCode[error.status]
    except KeyError:
        return grpc.StatusCode.UNKNOWN


class GrpcServer:
    """A gRPC server for ``api`` on 127.0.0.1:``port`` (0: any free port), and for the other
    ``services`` (Cloud Scheduler) on the same port."""

    def __init__(
        self,
        api: CloudTasksApi,
        port: int = 0,
        max_workers: int = 32,
        services: Iterable[grpc.GenericRpcHandler] = (),
    ) -> None:
        self._server = grpc.server(ThreadPoolExecutor(max_workers, "emulator-grpc"))
        tasks_methods = {name: unary_method(api, *spec) for name, spec in _TASKS_METHODS.items()}
        tasks_methods["CreateTask"] = _create_task(api)
        handlers = [
            grpc.method_handlers_generic_handler(SERVICE, tasks_methods),
            grpc.method_handlers_generic_handler(
                LOCATIONS_SERVICE,
                {name: unary_method(api, *spec) for name, spec in _LOCATIONS_METHODS.items()},
            ),
            *services,
        ]
        self._server.add_generic_rpc_handlers(handlers)
        self.port = self._server.add_insecure_port(f"{LOOPBACK}:{port}")
        self.target = f"{LOOPBACK}:{self.port}"

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop(grace=1).wait()
