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

from worker import constants as c
from worker.execution import Delivery, Executor, Reply
from worker.identity import HeaderLookup, Kind
from worker.logs import instance_id, log_execution, request_fields
from worker.outcome import Outcome

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

_PREFIXES = ((c.TASK_ROUTE_PREFIX, Kind.TASK), (c.SCHEDULER_ROUTE_PREFIX, Kind.SCHEDULER))
_STATUS_LINES = {status.value: f"{status.value} {status.phrase}" for status in HTTPStatus}


class DeliveryRoutes:
    """WSGI middleware: serves deliveries through ``executor``, passes the rest to ``app``.

    ``fields`` go into every delivery's log line (``auth: none`` when authentication is off).
    """

    def __init__(
        self, app: WSGIApp, executor: Executor, fields: Mapping[str, Any] | None = None
    ) -> None:
        self.app = app
        self.executor = executor
        self.fields = dict(fields or {})

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        path: str = environ.get("PATH_INFO", "")
        for prefix, kind in _PREFIXES:
            if path.startswith(prefix) and len(path) > len(prefix):
                name = path[len(prefix) :]
                started = time.monotonic()
                with request_fields(self.fields):
                    try:
                        reply = self.executor.execute(_delivery(environ, kind, name))
                    except Exception as exc:  # A bug: still one line and a JSON answer.
                        reply = _crashed(kind, name, environ, started, exc)
                return _respond(reply, start_response)
        return self.app(environ, start_response)


def _crashed(
    kind: Kind, name: str, environ: Mapping[str, Any], started: float, error: Exception
) -> Reply:
    """The answer, and the one log line, of a delivery the executor raised on."""
    reply = Reply(500, Outcome.ERROR, "internal error; see the worker's log")
    fields = {
        "handler": name[:100],  # Caller-chosen: cap what it puts in the log.
        "kind": kind.value,
        "method": str(environ.get("REQUEST_METHOD", ""))[:16],
        "outcome": reply.outcome.value,
        "status": reply.status,
        "duration_ms": round((time.monotonic() - started) * 1000, 3),
        "instance": instance_id(),
    }
    log_execution(f"{kind.value} {name[:100]}: {reply.message}", fields, logging.ERROR, error)
    return reply


def _delivery(environ: Mapping[str, Any], kind: Kind, name: str) -> Delivery:
    query = environ.get("QUERY_STRING", "")
    return Delivery(
        kind=kind,
        handler=name,
        header=_header_lookup(environ),
        query=dict(parse_qsl(query, keep_blank_values=True)) if query else {},
        body=_read_body(environ),
        url=_path_and_query(environ),
        authorization=environ.get("HTTP_AUTHORIZATION"),
        method=environ.get("REQUEST_METHOD", "GET"),
    )


def _header_lookup(environ: Mapping[str, Any]) -> HeaderLookup:
    """Header values from the environ, looked up case-insensitively (WSGI upper-cases names
    and joins repeated headers with commas, which no identity value may contain)."""

    def lookup(name: str) -> Sequence[str]:
        value = environ.get("HTTP_" + name.upper().replace("-", "_"))
        return () if value is None else (value,)

    return lookup


def _read_body(environ: Mapping[str, Any]) -> bytes | None:
    """The body, or None if it is larger than Cloud Tasks allows (read no further than that)."""
    length = environ.get("CONTENT_LENGTH")
    if length:
        try:
            size = int(length)
        except ValueError:
            size = 0
        if size > c.MAX_BODY_BYTES:
            return None
        if size <= 0:
            return b""
        body: bytes = environ["wsgi.input"].read(size)
        return body
    # No length: chunked, or none at all. Read at most one byte past the limit.
    stream = environ.get("wsgi.input")
    if stream is None or not environ.get("HTTP_TRANSFER_ENCODING"):
        return b""
    chunked: bytes = stream.read(c.MAX_BODY_BYTES + 1)
    return None if len(chunked) > c.MAX_BODY_BYTES else chunked


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
