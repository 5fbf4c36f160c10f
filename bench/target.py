"""A trivial threaded HTTP target that counts the POSTs it answers (benchmark helper)."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Counter:
    value = 0
    lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # Headers and body go out in two writes.

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with _Counter.lock:
            _Counter.value += 1
        self._answer(b"ok")

    def do_GET(self) -> None:
        with _Counter.lock:
            count = _Counter.value
        self._answer(str(count).encode())

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
