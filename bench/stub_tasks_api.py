"""A minimal Cloud Tasks REST endpoint for CreateTask and BatchCreateTasks (benchmark helper,
its own process).

It answers like the real API (the task back on success, 409 ALREADY_EXISTS for a known name;
a done operation for a batch, taken names in its ``failedRequests``) after an optional latency
per call, and does nothing else, so that a producer benchmark measures the producer.

    python bench/stub_tasks_api.py PORT [LATENCY_MS]
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_names: set[str] = set()
LATENCY = 0.0  # Seconds each answer waits, like a round trip to the real API.
_lock = threading.Lock()
_TYPES = "type.googleapis.com/google.cloud.tasks.v2."


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # Headers and body go out in two writes.

    def do_POST(self) -> None:
        time.sleep(LATENCY)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if self.path.split("?", 1)[0].endswith(":batchCreate"):
            self._answer(200, _batch(body["requests"]))
            return
        task = body["task"]
        with _lock:
            duplicate = task["name"] in _names
            _names.add(task["name"])
        if duplicate:
            error = {
                "code": 409,
                "message": "Requested entity already exists",
                "status": "ALREADY_EXISTS",
            }
            self._answer(409, {"error": error})
        else:
            self._answer(200, task)

    def _answer(self, status: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        return None


def _batch(requests: list[dict[str, Any]]) -> dict[str, Any]:
    created: list[dict[str, Any]] = []
    failed: dict[str, dict[str, Any]] = {}
    with _lock:
        for index, request in enumerate(requests):
            task = request["task"]
            if task["name"] in _names:
                failed[str(index)] = {"code": 6, "message": "Requested entity already exists"}
            else:
                _names.add(task["name"])
                created.append({"name": task["name"]})
    return {
        "name": "projects/bench/locations/us-central1/operations/stub",
        "done": True,
        "metadata": {
            "@type": _TYPES + "BatchCreateTasksMetadata",
            "state": "PARTIALLY_SUCCEEDED" if failed else "SUCCEEDED",
            "failedRequests": failed,
        },
        "response": {"@type": _TYPES + "BatchCreateTasksResponse", "tasks": created},
    }


if __name__ == "__main__":
    LATENCY = float(sys.argv[2]) / 1000 if len(sys.argv) > 2 else 0.0
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
