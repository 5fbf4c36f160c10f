"""A local HTTP endpoint that answers like the Cloud Tasks v2 REST API's CreateTask and
BatchCreateTasks (each request of a batch as its own CreateTask, as the emulator does)."""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from typing import Any

from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

CREATE_PATH = re.compile(r"^/v2/projects/[^/]+/locations/[^/]+/queues/[^/]+/tasks$")
BATCH_PATH = re.compile(r"^/v2/projects/[^/]+/locations/[^/]+/queues/[^/]+/tasks:batchCreate$")
_TYPES = "type.googleapis.com/google.cloud.tasks.v2."


class FakeCloudTasks:
    """Records every create, de-duplicates names, and fails on demand.

    ``failures`` holds ``(http_status, grpc_status_name, create_anyway)`` answers to give before
    behaving normally (a batch takes one for the whole call); ``create_anyway`` stores the
    task (the batch's tasks, its operation kept for its ``requestId``) first, like a lost
    response; a batch repeating a ``requestId`` gets that operation back. ``batches`` counts the
    BatchCreateTasks calls, ``requests`` holds the CreateTask calls.
    """

    def __init__(self, server: HTTPServer) -> None:
        self.server = server
        self.endpoint = f"http://127.0.0.1:{server.port}"
        self.tasks: dict[str, dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        self.failures: deque[tuple[int, str, bool]] = deque()
        self.batches = 0
        self.operations: dict[str, str] = {}  # By requestId, which Cloud Tasks replays.
        self._lock = threading.Lock()
        server.expect_request(CREATE_PATH, method="POST").respond_with_handler(self._create)
        server.expect_request(BATCH_PATH, method="POST").respond_with_handler(self._batch)

    def fail_next(self, status: int, grpc_status: str, *, create_anyway: bool = False) -> None:
        self.failures.append((status, grpc_status, create_anyway))

    def _create(self, request: Request) -> Response:
        body = request.get_json()
        with self._lock:
            self.requests.append(
                {"path": request.path, "query": request.query_string.decode(), "body": body}
            )
            task = body["task"]
            if self.failures:
                status, grpc_status, create_anyway = self.failures.popleft()
                if create_anyway:
                    self.tasks[task["name"]] = task
                return error(status, grpc_status, "injected failure")
            if task["name"] in self.tasks:
                return error(409, "ALREADY_EXISTS", "Requested entity already exists")
            if not task["name"].startswith(request.path[len("/v2/") : -len("/tasks")] + "/tasks/"):
                return error(400, "INVALID_ARGUMENT", "task name does not match the queue")
            self.tasks[task["name"]] = task
        return Response(json.dumps(task), content_type="application/json")

    def _batch(self, request: Request) -> Response:
        body = request.get_json()
        parent = request.path[len("/v2/") : -len("/tasks:batchCreate")]
        request_id = body.get("requestId")
        with self._lock:
            self.batches += 1
            if request_id and request_id in self.operations:  # The first operation, replayed.
                return Response(self.operations[request_id], content_type="application/json")
            if self.failures:
                status, grpc_status, create_anyway = self.failures.popleft()
                if create_anyway:  # The batch runs; its answer is lost.
                    self._run_batch(parent, body)
                return error(status, grpc_status, "injected failure")
            return Response(self._run_batch(parent, body), content_type="application/json")

    def _run_batch(self, parent: str, body: dict[str, Any]) -> str:
        """Create the batch's tasks; its operation, kept under its ``requestId``."""
        created: list[dict[str, Any]] = []
        failed: dict[str, dict[str, Any]] = {}
        for index, item in enumerate(body["requests"]):
            task = item["task"]
            if task["name"] in self.tasks:
                failed[str(index)] = {"code": 6, "message": "Requested entity already exists"}
            elif not task["name"].startswith(parent + "/tasks/"):
                failed[str(index)] = {"code": 3, "message": "task name does not match"}
            else:
                self.tasks[task["name"]] = task
                created.append(task)
        operation = json.dumps(
            {
                "name": f"{parent.rsplit('/queues/', 1)[0]}/operations/{self.batches}",
                "done": True,
                "metadata": {
                    "@type": _TYPES + "BatchCreateTasksMetadata",
                    "state": "PARTIALLY_SUCCEEDED" if failed else "SUCCEEDED",
                    "failedRequests": failed,
                },
                "response": {"@type": _TYPES + "BatchCreateTasksResponse", "tasks": created},
            }
        )
        if body.get("requestId"):
            self.operations[body["requestId"]] = operation
        return operation


def error(status: int, grpc_status: str, message: str) -> Response:
    payload = {"error": {"code": status, "message": message, "status": grpc_status}}
    return Response(json.dumps(payload), status=status, content_type="application/json")
