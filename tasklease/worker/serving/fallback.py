"""Answers and log lines for the requests the executor never answers itself.

Flask rejects some requests before any tasklease route runs (a path no route matches, such as
one with a newline in it; a wrong method on ``/healthz``), and a bug can make the executor
raise. Each still gets a JSON answer and exactly one execution log line, like every delivery.
"""

from __future__ import annotations

import logging
import time

import flask
from werkzeug.exceptions import HTTPException

from tasklease import protocol
from tasklease.worker.core.outcome import Outcome
from tasklease.worker.delivery.reply import Reply
from tasklease.worker.observe.logs import instance_id, log_execution


def is_tasklease_path(path: str) -> bool:
    """Whether ``path`` is one of the routes tasklease adds to an app."""
    return (
        path.startswith(
            (
                protocol.TASK_ROUTE_PREFIX,
                protocol.SCHEDULER_ROUTE_PREFIX,
                protocol.SIGNAL_ROUTE_PREFIX,
            )
        )
        or path == "/healthz"
    )


def reply_for_http_error(error: HTTPException) -> Reply:
    """The JSON answer to a request Flask itself refused."""
    status = error.code or 500
    if status >= 500:
        return Reply(status, Outcome.ERROR, "internal error")
    return Reply(status, Outcome.REJECTED, error.name.lower())


def reply_for_crash() -> Reply:
    """The answer when the executor raised: no internals go to the caller, the log has them."""
    return Reply.of(Outcome.ERROR, "internal error; see the worker's log")


def log_reply(reply: Reply, started: float, error: BaseException | None = None) -> None:
    """The one execution line of a request that did not go through the executor's own."""
    request = flask.request
    path = request.path
    if path.startswith(protocol.TASK_ROUTE_PREFIX):
        kind, name = "task", path[len(protocol.TASK_ROUTE_PREFIX) :]
    elif path.startswith(protocol.SCHEDULER_ROUTE_PREFIX):
        kind, name = "scheduler", path[len(protocol.SCHEDULER_ROUTE_PREFIX) :]
    else:
        kind, name = "http", path
    name = name[:100]  # Caller-chosen: cap what it puts in the log.
    fields = {
        "handler": name,
        "kind": kind,
        "method": request.method[:16],
        "outcome": reply.outcome.value,
        "status": reply.status,
        "run_id": reply.run_id,
        "duration_ms": round((time.monotonic() - started) * 1000, 3),
        "instance": instance_id(),
    }
    level = logging.ERROR if reply.status >= 500 else logging.INFO
    log_execution(f"{kind} {name}: {reply.message}", fields, level, error)
