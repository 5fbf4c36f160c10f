"""The delivery routes as WSGI middleware: ``/tasks/<name>`` and ``/jobs/<name>`` are answered
straight from the WSGI environ, in front of the Flask app.

A delivery needs a few headers, the body and one answer; Flask's request and app contexts,
URL map and response machinery cost more than the whole exactly-once protocol does
(bench/worker_throughput.py). Every other path goes to the Flask app unchanged, so users keep
their own routes (and ``/healthz``) on the same app.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl

from tasklease import protocol
from tasklease.worker.core.identity import HeaderLookup, Kind
from tasklease.worker.core.outcome import Outcome
from tasklease.worker.delivery.executor import Delivery, Executor
from tasklease.worker.delivery.reply import Reply
from tasklease.worker.observe.logs import instance_id, log_execution, request_fields

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

PREFIXES = (
    (protocol.TASK_ROUTE_PREFIX, Kind.TASK),
    (protocol.SCHEDULER_ROUTE_PREFIX, Kind.SCHEDULER),
)
_STATUS_LINES = {status.value: f"{status.value} {status.phrase}" for status in HTTPStatus}


class DeliveryRoutes:
    """WSGI middleware: serves deliveries through ``executor``, passes the rest to ``app``.

    ``fields`` go into every delivery's log line (``auth: none`` when authentication is off);
    a body over ``max_body_bytes`` is not read, and answered 413.
    """

    def __init__(
        self,
        app: WSGIApp,
        executor: Executor,
        fields: Mapping[str, Any] | None = None,
        *,
        max_body_bytes: int = protocol.MAX_TASK_BYTES,
    ) -> None:
        self.app = app
        self.executor = executor
        self.fields = dict(fields or {})
        self.max_body_bytes = max_body_bytes

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        path: str = environ.get("PATH_INFO", "")
        for prefix, kind in PREFIXES:
            if path.startswith(prefix) and len(path) > len(prefix):
                name = path[len(prefix) :]
                started = time.monotonic()
                with request_fields(self.fields):
                    limit = self.max_body_bytes
                    try:
                        delivery = _delivery(environ, kind, name, limit)
                    except BadBody as exc:
                        delivery = _delivery(environ, kind, name, limit, body=b"", refusal=str(exc))
                    try:
                        reply = self.executor.execute(delivery)
                    except Exception as exc:  # A bug: still one line and a JSON answer.
                        method = str(environ.get("REQUEST_METHOD", ""))
                        reply = crashed(kind, name, method, started, exc)
                return _respond(reply, start_response)
        return self.app(environ, start_response)


def crashed(kind: Kind, name: str, method: str, started: float, error: Exception) -> Reply:
    """The answer, and the one log line, of a delivery the executor raised on (WSGI and
    ASGI alike)."""
    reply = Reply.of(Outcome.ERROR, "internal error; see the worker's log")
    fields = {
        "handler": name[:100],  # Caller-chosen: cap what it puts in the log.
        "kind": kind.value,
        "method": method[:16],
        "outcome": reply.outcome.value,
        "status": reply.status,
        "duration_ms": round((time.monotonic() - started) * 1000, 3),
        "instance": instance_id(),
    }
    log_execution(f"{kind.value} {name[:100]}: {reply.message}", fields, logging.ERROR, error)
    return reply


def _delivery(
    environ: Mapping[str, Any],
    kind: Kind,
    name: str,
    limit: int,
    *,
    body: bytes | None = None,
    refusal: str | None = None,
) -> Delivery:
    query = environ.get("QUERY_STRING", "")
    return Delivery(
        kind=kind,
        handler=name,
        header=header_lookup(environ),
        query=dict(parse_qsl(query, keep_blank_values=True)) if query else {},
        body=read_body(environ, limit) if refusal is None else body,
        body_limit=limit,
        refusal=refusal,
        url=_path_and_query(environ),
        authorization=environ.get("HTTP_AUTHORIZATION"),
        method=environ.get("REQUEST_METHOD", "GET"),
    )


def header_lookup(environ: Mapping[str, Any]) -> HeaderLookup:
    """Header values from the environ, looked up case-insensitively (WSGI upper-cases names
    and joins repeated headers with commas, which no identity value may contain)."""

    def lookup(name: str) -> Sequence[str]:
        value = environ.get("HTTP_" + name.upper().replace("-", "_"))
        return () if value is None else (value,)

    return lookup


class BadBody(ValueError):
    """The request's body is not what its framing says: refuse it, claim nothing."""


def read_body(environ: Mapping[str, Any], limit: int) -> bytes | None:
    """The body, or None if it is over ``limit`` bytes (read no further than that).

    Raises :class:`BadBody` for a Content-Length that is not a number, or a body that ended
    before it: a connection cut mid-body must not reach the handler (or be dead-lettered as
    bad JSON) when the retry will carry the whole of it.
    """
    length = environ.get("CONTENT_LENGTH")
    stream = environ.get("wsgi.input")
    if length:
        if not (length.isascii() and length.isdigit()):
            raise BadBody(f"Content-Length {length[:40]!r} is not a number")
        size = int(length)
        if size > limit:
            return None
        body: bytes = stream.read(size) if size and stream is not None else b""
        if len(body) != size:
            raise BadBody(f"the body ended after {len(body)} of its {size} bytes")
        return body
    # No length: a chunked body, or one the server delimited itself (PEP 3333's
    # wsgi.input_terminated, which gunicorn sets). Read at most one byte past the limit.
    framed = environ.get("HTTP_TRANSFER_ENCODING") or environ.get("wsgi.input_terminated")
    if stream is None or not framed:
        return b""
    unsized: bytes = stream.read(limit + 1)
    return None if len(unsized) > limit else unsized


def _path_and_query(environ: Mapping[str, Any]) -> str:
    """What the request addressed, for the authenticator's information only: the audience
    never comes from the request (its Host is the caller's to choose)."""
    path = f"{environ.get('SCRIPT_NAME', '')}{environ.get('PATH_INFO', '')}"
    query = environ.get("QUERY_STRING", "")
    return f"{path}?{query}" if query else path


def _respond(reply: Reply, start_response: Callable[..., Any]) -> list[bytes]:
    body = reply.body_bytes()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    headers.extend(reply.headers().items())
    if reply.status == 405:
        headers.append(("Allow", "POST"))
    start_response(_STATUS_LINES.get(reply.status, f"{reply.status} Unknown"), headers)
    return [body]
