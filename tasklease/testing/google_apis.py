"""Google's Workflows, Cloud Run and Cloud Build APIs faked on loopback gRPC, for tests and the
demo: just enough of each (start, list, filter) to drive the real client libraries.

    with FakeGoogleApis() as apis:
        target = workflows_execution(WORKFLOW, client=apis.workflows_client())

Each fake keeps what was started, answers the list calls as the API documents them (the
argument only in the FULL view; filters on labels / trigger_id), and fails the next calls
with injected status codes (``apis.workflows.fail("CreateExecution", grpc.StatusCode.NOT_FOUND)``).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections import defaultdict
from concurrent import futures
from typing import Any, NoReturn

import grpc
from google.longrunning import operations_pb2  # type: ignore[import-untyped]
from google.protobuf import any_pb2

from tasklease.worker.targets.base import import_library

_LABEL_FILTER = re.compile(r'labels\.([a-z][a-z0-9_-]{0,62})\s*=\s*"([^"]*)"')
_TRIGGER_FILTER = re.compile(r'trigger_id\s*=\s*"([^"]*)"')


class _Fake:
    """Shared by the three fakes: a lock, injected failures, one page at a time."""

    service: str

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._failures: dict[str, list[grpc.StatusCode]] = defaultdict(list)
        self.calls: dict[str, int] = defaultdict(int)
        # A method named here waits for its event before it answers (a slow API, for tests).
        self.gates: dict[str, threading.Event] = {}

    def fail(self, method: str, *codes: grpc.StatusCode) -> None:
        """Answer the next calls of ``method`` with these status codes, in order."""
        with self.lock:
            self._failures[method].extend(codes)

    def _enter(self, method: str, context: Any) -> None:
        with self.lock:
            self.calls[method] += 1
            code = self._failures[method].pop(0) if self._failures[method] else None
        if code is not None:
            _abort(context, code, f"injected {code.name}")
        gate = self.gates.get(method)
        if gate is not None:
            gate.wait(timeout=10)

    @staticmethod
    def _page(items: list[Any], page_size: int, page_token: str) -> tuple[list[Any], str]:
        start = int(page_token or 0)
        size = page_size or 100
        end = start + size
        return items[start:end], (str(end) if end < len(items) else "")

    def handler(self) -> grpc.GenericRpcHandler:
        raise NotImplementedError


def _operation(name: str, metadata: Any) -> operations_pb2.Operation:
    packed = any_pb2.Any()
    packed.Pack(type(metadata).pb(metadata))
    return operations_pb2.Operation(name=name, metadata=packed, done=False)


class FakeWorkflows(_Fake):
    """google.cloud.workflows.executions.v1.Executions: Create, List, Get."""

    service = "google.cloud.workflows.executions.v1.Executions"

    def __init__(self) -> None:
        super().__init__()
        self.lib = import_library("google.cloud.workflows.executions_v1", "workflows")
        self.executions: list[Any] = []  # Oldest first.
        self.label_filter = True  # False: refuse filters, as an API without them would.

    def create_execution(self, request: Any, context: Any) -> Any:
        self._enter("CreateExecution", context)
        execution = self.lib.Execution(request.execution)
        execution.name = f"{request.parent}/executions/{uuid.uuid4()}"
        execution.state = self.lib.Execution.State.ACTIVE
        with self.lock:
            self.executions.append(execution)
        return execution

    def list_executions(self, request: Any, context: Any) -> Any:
        self._enter("ListExecutions", context)
        wanted: dict[str, str] = {}
        if request.filter:
            match = _LABEL_FILTER.fullmatch(request.filter.strip())
            if match is None or not self.label_filter:
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "unsupported filter")
            wanted = {match[1]: match[2]}
        with self.lock:
            found = [
                e
                for e in reversed(self.executions)  # Newest first, as the API lists them.
                if e.name.startswith(request.parent + "/")
                and all(e.labels.get(k) == v for k, v in wanted.items())
            ]
        page, token = self._page(found, min(request.page_size or 100, 100), request.page_token)
        full = request.view == self.lib.ExecutionView.FULL
        return self.lib.ListExecutionsResponse(
            executions=[self._view(e, full) for e in page], next_page_token=token
        )

    def get_execution(self, request: Any, context: Any) -> Any:
        self._enter("GetExecution", context)
        with self.lock:
            for execution in self.executions:
                if execution.name == request.name:
                    return self._view(execution, request.view != self.lib.ExecutionView.BASIC)
        _abort(context, grpc.StatusCode.NOT_FOUND, f"{request.name} not found")

    def _view(self, execution: Any, full: bool) -> Any:
        shown = self.lib.Execution(execution)
        if not full:
            shown.argument = ""  # The BASIC view leaves the argument (and result) out.
        return shown

    def handler(self) -> grpc.GenericRpcHandler:
        lib = self.lib
        return grpc.method_handlers_generic_handler(
            self.service,
            {
                "CreateExecution": _unary(
                    self.create_execution, lib.CreateExecutionRequest, lib.Execution
                ),
                "ListExecutions": _unary(
                    self.list_executions, lib.ListExecutionsRequest, lib.ListExecutionsResponse
                ),
                "GetExecution": _unary(self.get_execution, lib.GetExecutionRequest, lib.Execution),
            },
        )


class FakeCloudRun(_Fake):
    """google.cloud.run.v2 Jobs.RunJob (an operation whose metadata is the Execution) and
    Executions.ListExecutions (no filter in v2; newest first)."""

    service = "google.cloud.run.v2.Jobs"

    def __init__(self) -> None:
        super().__init__()
        self.lib = import_library("google.cloud.run_v2", "run")
        self.executions: list[Any] = []
        self.requests: list[Any] = []

    def run_job(self, request: Any, context: Any) -> operations_pb2.Operation:
        self._enter("RunJob", context)
        run = self.lib
        with self.lock:
            number = sum(e.job == request.name.rpartition("/")[2] for e in self.executions)
        job_id = request.name.rpartition("/")[2]
        containers = [
            run.Container(name=override.name or job_id, env=list(override.env), args=override.args)
            for override in request.overrides.container_overrides
        ] or [run.Container(name=job_id)]
        execution = run.Execution(
            name=f"{request.name}/executions/{job_id}-{number + 1:05d}",
            job=job_id,
            template=run.TaskTemplate(containers=containers),
            task_count=request.overrides.task_count or 1,
        )
        with self.lock:
            self.requests.append(request)
            self.executions.append(execution)
        location = request.name.split("/jobs/")[0]
        return _operation(f"{location}/operations/{uuid.uuid4()}", execution)

    def list_executions(self, request: Any, context: Any) -> Any:
        self._enter("ListExecutions", context)
        with self.lock:
            found = [
                e for e in reversed(self.executions) if e.name.startswith(request.parent + "/")
            ]
        page, token = self._page(found, request.page_size, request.page_token)
        return self.lib.ListExecutionsResponse(executions=page, next_page_token=token)

    def handler(self) -> grpc.GenericRpcHandler:
        run = self.lib
        return grpc.method_handlers_generic_handler(
            self.service,
            {"RunJob": _unary(self.run_job, run.RunJobRequest, operations_pb2.Operation)},
        )

    def executions_handler(self) -> grpc.GenericRpcHandler:
        run = self.lib
        return grpc.method_handlers_generic_handler(
            "google.cloud.run.v2.Executions",
            {
                "ListExecutions": _unary(
                    self.list_executions, run.ListExecutionsRequest, run.ListExecutionsResponse
                )
            },
        )


class FakeCloudBuild(_Fake):
    """google.devtools.cloudbuild.v1.CloudBuild: RunBuildTrigger (an operation whose metadata
    holds the build) and ListBuilds (filtered on trigger_id; newest first)."""

    service = "google.devtools.cloudbuild.v1.CloudBuild"

    def __init__(self) -> None:
        super().__init__()
        self.lib = import_library("google.cloud.devtools.cloudbuild_v1", "build")
        self.builds: list[Any] = []

    def run_build_trigger(self, request: Any, context: Any) -> operations_pb2.Operation:
        self._enter("RunBuildTrigger", context)
        build_id = str(uuid.uuid4())
        location = request.name.split("/triggers/")[0] or f"projects/{request.project_id}"
        build = self.lib.Build(
            id=build_id,
            name=f"{location}/builds/{build_id}",
            project_id=request.project_id,
            build_trigger_id=request.trigger_id,
            substitutions=dict(request.source.substitutions),
            status=self.lib.Build.Status.QUEUED,
        )
        with self.lock:
            self.builds.append(build)
        metadata = self.lib.BuildOperationMetadata(build=build)
        return _operation(f"{location}/operations/{uuid.uuid4()}", metadata)

    def list_builds(self, request: Any, context: Any) -> Any:
        self._enter("ListBuilds", context)
        trigger = None
        if request.filter:
            match = _TRIGGER_FILTER.fullmatch(request.filter.strip())
            if match is None:
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "unsupported filter")
            trigger = match[1]
        with self.lock:
            found = [
                b
                for b in reversed(self.builds)
                if b.project_id == request.project_id
                and (trigger is None or b.build_trigger_id == trigger)
            ]
        page, token = self._page(found, request.page_size, request.page_token)
        return self.lib.ListBuildsResponse(builds=page, next_page_token=token)

    def handler(self) -> grpc.GenericRpcHandler:
        lib = self.lib
        return grpc.method_handlers_generic_handler(
            self.service,
            {
                "RunBuildTrigger": _unary(
                    self.run_build_trigger, lib.RunBuildTriggerRequest, operations_pb2.Operation
                ),
                "ListBuilds": _unary(
                    self.list_builds, lib.ListBuildsRequest, lib.ListBuildsResponse
                ),
            },
        )


def _abort(context: Any, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)  # Raises, to end the call with this status.
    raise AssertionError("unreachable")


def _unary(function: Any, request_type: Any, response_type: Any) -> grpc.RpcMethodHandler:
    serialize = getattr(response_type, "serialize", None) or response_type.SerializeToString
    return grpc.unary_unary_rpc_method_handler(
        function,
        request_deserializer=request_type.deserialize,
        response_serializer=serialize,
    )


class FakeGoogleApis:
    """One loopback gRPC server with the fakes of the libraries installed (``apis``: any of
    ``"workflows"``, ``"run"``, ``"build"``)."""

    def __init__(self, apis: tuple[str, ...] = ("workflows", "run", "build")) -> None:
        self.workflows = FakeWorkflows() if "workflows" in apis else None
        self.run = FakeCloudRun() if "run" in apis else None
        self.build = FakeCloudBuild() if "build" in apis else None
        self._server: grpc.Server | None = None
        self.host = ""

    def __enter__(self) -> FakeGoogleApis:
        server = grpc.server(futures.ThreadPoolExecutor(8))
        handlers = [fake.handler() for fake in (self.workflows, self.run, self.build) if fake]
        if self.run is not None:
            handlers.append(self.run.executions_handler())
        server.add_generic_rpc_handlers(tuple(handlers))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server, self.host = server, f"127.0.0.1:{port}"
        return self

    def __exit__(self, *_: object) -> None:
        if self._server is not None:
            self._server.stop(None)

    def _channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.host)

    def workflows_client(self) -> Any:
        """An ExecutionsClient over gRPC to this server (its only transport besides asyncio)."""
        lib = import_library("google.cloud.workflows.executions_v1", "workflows")
        transport = lib.services.executions.transports.ExecutionsGrpcTransport(
            channel=self._channel()
        )
        return lib.ExecutionsClient(transport=transport)

    def run_clients(self) -> tuple[Any, Any]:
        """A JobsClient and an ExecutionsClient over gRPC to this server."""
        run = import_library("google.cloud.run_v2", "run")
        jobs = run.services.jobs.transports.JobsGrpcTransport(channel=self._channel())
        executions = run.services.executions.transports.ExecutionsGrpcTransport(
            channel=self._channel()
        )
        return run.JobsClient(transport=jobs), run.ExecutionsClient(transport=executions)

    def build_client(self) -> Any:
        """A CloudBuildClient over gRPC to this server."""
        lib = import_library("google.cloud.devtools.cloudbuild_v1", "build")
        transport = lib.services.cloud_build.transports.CloudBuildGrpcTransport(
            channel=self._channel()
        )
        return lib.CloudBuildClient(transport=transport)
