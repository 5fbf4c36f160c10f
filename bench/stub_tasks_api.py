"""A minimal Cloud Tasks REST endpoint for CreateTask (benchmark helper, its own process).

It answers like the real API (the task back on success, 409 ALREADY_EXISTS for a known name)
and does nothing else, so that a producer benchmark measures the producer.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_names: set[str] = set()
LATENCY = 0.0  # Seconds each answer waits, like a round trip to the real API.
_lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # Headers and body go out in two writes.

    def do_POST(self) -> None:
        time.sleep(LATENCY)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
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


if __name__ == "__main__":
    LATENCY = float(sys.argv[2]) / 1000 if len(sys.argv) > 2 else 0.0
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
