"""A local HTTP endpoint that answers like the Cloud Tasks v2 REST API's CreateTask."""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from typing import Any

from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

CREATE_PATH = re.compile(r"^/v2/projects/[^/]+/locations/[^/]+/queues/[^/]+/tasks$")


class FakeCloudTasks:
    """Records every create, de-duplicates names, and fails on demand.

    ``failures`` holds ``(http_status, grpc_status_name, create_anyway)`` answers to give before
    behaving normally; ``create_anyway`` stores the task first, like a lost response.
    """

    def __init__(self, server: HTTPServer) -> None:
        self.server = server
        self.endpoint = f"http://127.0.0.1:{server.port}"
        self.tasks: dict[str, dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        self.failures: deque[tuple[int, str, bool]] = deque()
        self._lock = threading.Lock()
        server.expect_request(CREATE_PATH, method="POST").respond_with_handler(self._create)

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


def error(status: int, grpc_status: str, message: str) -> Response:
    payload = {"error": {"code": status, "message": message, "status": grpc_status}}
    return Response(json.dumps(payload), status=status, content_type="application/json")
