"""The delivery routes as an ASGI app: ``/tasks/<name>`` and ``/jobs/<name>`` are answered by
the same :class:`~tasklease.worker.delivery.executor.Executor` as under WSGI, everything else
goes to ``fallback``.

The event loop reads the request and writes the answer. The whole of ``Executor.execute``
(authentication, claim, handler, finish: every store call) runs in a worker thread, at most
``threads`` at once, so no store call ever blocks the loop, and an ``async def`` handler is
awaited on tasklease's own handler loop (:mod:`tasklease.worker.runtime.event_loop`), as under
gunicorn, whatever the store.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any
from urllib.parse import parse_qsl

import anyio.to_thread

from tasklease.worker.core.identity import HeaderLookup, Kind
from tasklease.worker.delivery.executor import Delivery
from tasklease.worker.delivery.reply import Reply
from tasklease.worker.observe.logs import request_fields
from tasklease.worker.runtime.delivery_threads import DeliveryThreads
from tasklease.worker.serving.wsgi_routes import PREFIXES, BadBody, DeliveryRoutes, crashed

PREFIX_OF = {kind: prefix for prefix, kind in PREFIXES}

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_HEALTH = b'{"status":"ok"}'


def route_path(scope: Scope) -> str:
    """The path under the app's mount point: ASGI's ``path`` includes ``root_path``."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("/", ""):
        return path[len(root) :]
    return path


class AsgiDeliveries:
    """ASGI app: serves deliveries through ``routes``' executor (its log fields and body
    limit too), ``/healthz`` on the loop itself, and passes every other request (and
    websockets) to ``fallback``. Answers the lifespan protocol when served on its own."""

    def __init__(self, routes: DeliveryRoutes, fallback: ASGIApp, *, threads: int = 40) -> None:
        if threads < 1:
            raise ValueError(f"threads={threads!r}: at least 1")
        self.executor = routes.executor
        self.fields = routes.fields
        self.max_body_bytes = routes.max_body_bytes
        self.fallback = fallback
        self.threads = threads
        self._limiter: anyio.CapacityLimiter | None = None
        self._pool: DeliveryThreads | None = None
        self._pool_pid: int | None = None

    async def _in_thread(self, function: Callable[[], Reply]) -> Reply:
        """``function()`` in one of this process's delivery threads, in the caller's context
        (its trace). On asyncio (uvicorn, hypercorn) threads of its own
        (:mod:`tasklease.worker.runtime.delivery_threads`, a third of ``run_in_executor``'s cost per
        call); on another event loop (trio), anyio's, as many at once."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._limiter is None:
                self._limiter = anyio.CapacityLimiter(self.threads)
            return await anyio.to_thread.run_sync(function, limiter=self._limiter)
        if self._pool is None or self._pool_pid != os.getpid():  # Made where it serves.
            self._pool = DeliveryThreads(self.threads)
            self._pool_pid = os.getpid()
        return await self._pool.run(function)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            if self._pool is not None:
                self._pool.close()
                self._pool = None
            return
        if scope["type"] == "http":
            path = route_path(scope)
            for prefix, kind in PREFIXES:
                if path.startswith(prefix) and len(path) > len(prefix):
                    await self._deliver(scope, receive, send, kind, path)
                    return
            if path == "/healthz" and scope["method"] in ("GET", "HEAD"):
                await _send(send, 200, _HEALTH, [(b"content-type", b"application/json")])
                return
        await self.fallback(scope, receive, send)

    async def _deliver(
        self, scope: Scope, receive: Receive, send: Send, kind: Kind, route: str
    ) -> None:
        started = time.monotonic()
        name = route[len(PREFIX_OF[kind]) :]
        headers = _headers(scope)
        limit = self.max_body_bytes
        refusal = None
        try:
            body = await read_body(headers, receive, limit)
        except BadBody as exc:
            body, refusal = b"", str(exc)
        query = scope.get("query_string", b"").decode("latin-1")
        root: str = scope.get("root_path", "")
        path = f"{root}{route}"
        authorization = headers.get("authorization")
        delivery = Delivery(
            kind=kind,
            handler=name,
            header=_lookup(headers),
            query=dict(parse_qsl(query, keep_blank_values=True)) if query else {},
            body=body,
            body_limit=limit,
            refusal=refusal,
            url=f"{path}?{query}" if query else path,
            authorization=authorization[0] if authorization else None,
            method=scope["method"],
            mount=root.rstrip("/"),
        )

        def execute() -> Reply:
            with request_fields(self.fields):
                try:
                    return self.executor.execute(delivery)
                except Exception as exc:  # A bug: still one line and a JSON answer.
                    return crashed(kind, name, delivery.method, started, exc)

        reply = await self._in_thread(execute)
        extra = [
            (key.encode("latin-1"), value.encode("latin-1"))
            for key, value in reply.headers().items()
        ]
        if reply.status == 405:
            extra.append((b"allow", b"POST"))
        await _send(
            send, reply.status, reply.body_bytes(), [(b"content-type", b"application/json"), *extra]
        )


def _headers(scope: Scope) -> dict[str, list[str]]:
    """The request's headers by lower-case name, every value of a repeated one kept."""
    headers: dict[str, list[str]] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").lower()
        values = headers.get(name)
        if values is None:
            headers[name] = [raw_value.decode("latin-1")]
        else:
            values.append(raw_value.decode("latin-1"))
    return headers


# The names the protocol looks up are a few constants: lower-case each once.
_LOWER: dict[str, str] = {}


def _lookup(headers: dict[str, list[str]]) -> HeaderLookup:
    def lookup(name: str) -> Sequence[str]:
        key = _LOWER.get(name)
        if key is None:
            key = name.lower()
            if len(_LOWER) < 256:  # Bounded, whatever names a caller looks up.
                _LOWER[name] = key
        return headers.get(key, ())

    return lookup


async def read_body(headers: dict[str, list[str]], receive: Receive, limit: int) -> bytes | None:
    """The body, or None if it is over ``limit`` bytes: a Content-Length over it is not read
    at all, a body without one is read no further than one chunk past it.

    Raises :class:`BadBody` for a Content-Length that is not a number, or a body that ended
    (the client went away) before it was whole: as under WSGI, a cut body must never reach
    the handler, or be dead-lettered as bad JSON, when the retry will carry the whole of it.
    """
    lengths = headers.get("content-length")
    size = None
    if lengths:
        text = lengths[0].strip()
        if len(lengths) > 1 or not (text.isascii() and text.isdigit()):
            raise BadBody(f"Content-Length {lengths[0][:40]!r} is not a number")
        size = int(text)
        if size > limit:
            return None
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            expected = f" of its {size}" if size is not None else ""
            raise BadBody(f"the body ended after {total}{expected} bytes")
        chunk: bytes = message.get("body", b"")
        total += len(chunk)
        if total > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if size is not None and total != size:
        raise BadBody(f"the body ended after {total} of its {size} bytes")
    return b"".join(chunks)


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    """Nothing to start or stop: the store and executor were built with the app."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
