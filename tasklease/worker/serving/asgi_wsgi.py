"""A WSGI app (the worker's Flask app: dashboard, ``/metrics``, a user's own routes) served
inside the ASGI app, in worker threads of its own.

Small on purpose: every request and answer of those routes is small (a dashboard page, a
form), so the body is read whole (up to a limit) and the answer is collected before it is
sent. Starlette's own ``WSGIMiddleware`` is deprecated (starlette 1.x warns on import).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterable
from typing import Any

import anyio.to_thread

from tasklease.worker.serving.asgi_routes import Receive, Scope, Send, route_path
from tasklease.worker.serving.wsgi_routes import WSGIApp

_TOO_LARGE = b'{"status":"rejected","message":"body too large"}'


class WsgiBridge:
    """ASGI app running ``app`` (WSGI) for each HTTP request, at most ``threads`` at once,
    apart from the delivery threads; refuses websockets. ``SCRIPT_NAME`` is the mount."""

    def __init__(self, app: WSGIApp, *, max_body_bytes: int, threads: int = 8) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.threads = threads
        self._limiter: anyio.CapacityLimiter | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1003})
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                await _answer(send, 413, [(b"content-type", b"application/json")], _TOO_LARGE)
                return
            if not message.get("more_body", False):
                break
        environ = _environ(scope, bytes(body))
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.threads)
        status, headers, payload = await anyio.to_thread.run_sync(
            _call, self.app, environ, limiter=self._limiter
        )
        await _answer(send, status, headers, payload)


def _call(app: WSGIApp, environ: dict[str, Any]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started[:] = [status, headers]
        return lambda data: None  # The legacy write(): Flask never calls it.

    chunks: Iterable[bytes] = app(environ, start_response)
    try:
        payload = b"".join(chunks)
    finally:
        close: Callable[[], None] | None = getattr(chunks, "close", None)
        if close is not None:
            close()
    status, headers = started
    encoded = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]
    return int(status.split(" ", 1)[0]), encoded, payload


def _environ(scope: Scope, body: bytes) -> dict[str, Any]:
    server = scope.get("server") or ("localhost", 80)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        # PEP 3333: the path as latin-1 characters of its UTF-8 bytes.
        "SCRIPT_NAME": scope.get("root_path", "").encode().decode("latin-1"),
        "PATH_INFO": route_path(scope).encode().decode("latin-1"),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
        "SERVER_NAME": server[0],
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if scope.get("client"):
        environ["REMOTE_ADDR"] = scope["client"][0]
    for raw_name, raw_value in scope.get("headers", ()):
        text = raw_name.decode("latin-1")
        if "_" in text:  # HTTP_X_A would be x-a's too: drop them, as gunicorn does.
            continue
        name = text.upper().replace("-", "_")
        value = raw_value.decode("latin-1")
        if name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if name == "CONTENT_TYPE":
                environ[name] = value
            continue
        key = f"HTTP_{name}"
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


async def _answer(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
