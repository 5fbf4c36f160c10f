"""Structured logs in the shape Cloud Logging reads: one JSON object per line.

Cloud Run turns each JSON line on stdout/stderr into a LogEntry: ``severity`` becomes the
entry's severity, ``message`` its text, and every other field its ``jsonPayload``
(https://cloud.google.com/logging/docs/structured-logging).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from tasklease.worker.runtime.running import current_call

EXECUTION_LOGGER = "tasklease.execution"
FIELDS_ATTRIBUTE = "tasklease"  # LogRecord attribute that carries the structured fields.

# Fields every line written while serving one request carries (``auth: none``).
_REQUEST_FIELDS: ContextVar[Mapping[str, Any] | None] = ContextVar(
    "tasklease_request_fields", default=None
)
# An exception whose stack trace goes into the next execution line (see note_error).
_PENDING_ERROR: ContextVar[BaseException | None] = ContextVar(
    "tasklease_pending_error", default=None
)
# C0 and C1 control characters and DEL: in a terminal they forge lines or change colours.
_CONTROL = {n: f"\\x{n:02x}" for n in (*range(0x20), *range(0x7F, 0xA0))}
_CONTROL.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})

_SEVERITIES = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARNING",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "CRITICAL",
}


class CloudLoggingFormatter(logging.Formatter):
    """Formats a record as one JSON line with ``severity``, ``message`` and its fields."""

    def format(self, record: logging.LogRecord) -> str:
        stack = self.formatException(record.exc_info) if record.exc_info else None
        return json_line(
            record.levelno,
            record.getMessage(),
            datetime.fromtimestamp(record.created, tz=UTC),
            record.name,
            getattr(record, FIELDS_ATTRIBUTE, None) or {},
            stack_trace=stack,
        )


# json.dumps(entry, default=str) builds an encoder per call (any argument but the object
# does); one built once encodes the same text.
_LINE_ENCODER = json.JSONEncoder(default=str)


def json_line(
    level: int,
    message: str,
    moment: datetime,
    logger: str,
    fields: Mapping[str, Any],
    *,
    stack_trace: str | None = None,
) -> str:
    """One Cloud Logging line: the only place its shape is defined."""
    entry: dict[str, Any] = {
        "severity": _SEVERITIES.get(level, "DEFAULT"),
        "message": message,
        "time": moment.isoformat(),
        "logger": logger,
        **fields,
    }
    if stack_trace:
        entry["stack_trace"] = stack_trace
    return _LINE_ENCODER.encode(entry)


class ReadableFormatter(logging.Formatter):
    """One short line per record for a terminal (``TASKLEASE_LOG_FORMAT=text``)."""

    FIELDS = (
        "auth",
        "outcome",
        "status",
        "queue",
        "task_name",
        "job_name",
        "schedule_time",
        "attempt",
        "fencing_token",
        "transaction_tries",  # A transactional handler's: how often the database ran it.
        "run_id",
        "duration_ms",
        "auth_error",  # Why a request was refused a 401: its answer does not say.
        "known_handlers",  # A 404's: the names the worker does serve.
    )

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, FIELDS_ATTRIBUTE, None) or {}
        # An execution line names its handler in its message; any other line in a run (the
        # handler's own logging) names it here.
        names = self.FIELDS if record.name == EXECUTION_LOGGER else ("handler", *self.FIELDS)
        details = " ".join(
            f"{name}={str(fields[name])[:12] if name == 'run_id' else fields[name]}"
            for name in names
            if fields.get(name) is not None
        )
        moment = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        line = f"{moment} {record.levelname:<7} {record.getMessage()}"
        line = escape_controls(f"{line}  [{details}]" if details else line)
        if not record.exc_info:
            return line
        trace = self.formatException(record.exc_info).splitlines()
        return "\n".join([line, *(escape_controls(part) for part in trace)])


class RunFieldsFilter(logging.Filter):
    """Gives a record logged while a handler runs (the handler's own ``logging`` lines)
    the run id and handler as fields, for :class:`ReadableFormatter`; for a handler of a
    logging configuration, e.g. ``tasklease dev``'s gunicorn."""

    def filter(self, record: logging.LogRecord) -> bool:
        call = current_call()
        if call is not None and not getattr(record, FIELDS_ATTRIBUTE, None):
            setattr(record, FIELDS_ATTRIBUTE, {"run_id": call.run_id, "handler": call.handler})
        return True


def escape_controls(text: str) -> str:
    """``text`` with control characters written as escapes: request data (a path, a header)
    reaches log messages, and must not start a new line or send terminal escape codes."""
    return text.translate(_CONTROL)


def configure_logging(level: int = logging.INFO) -> None:
    """Send the ``tasklease`` loggers to stderr, once: JSON lines for Cloud Logging, or
    readable lines when ``TASKLEASE_LOG_FORMAT=text`` (``tasklease dev`` sets it).

    Does nothing when the application already configured logging (the root logger has a
    handler), so tasklease never overrides a user's choice.
    """
    logger = logging.getLogger("tasklease")
    if logger.handlers or logging.getLogger().handlers:
        return
    global _own_json_handler  # noqa: PLW0603 - the one handler this module installs.
    handler = logging.StreamHandler(sys.stderr)
    text = os.environ.get("TASKLEASE_LOG_FORMAT", "json").lower() == "text"
    handler.setFormatter(ReadableFormatter() if text else CloudLoggingFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    _own_json_handler = None if text else handler


# Loggers live as long as the process: looked up once, not under logging's lock per request.
_EXECUTION_LOG = logging.getLogger(EXECUTION_LOGGER)

# The JSON handler configure_logging installed, while it alone receives tasklease's lines.
_own_json_handler: logging.StreamHandler[Any] | None = None


def instance_id() -> str:
    """Which process handled a request: Cloud Run revision (if any), host and pid."""
    return _instance_id(_PID[0])


# This process's id, kept by a fork hook: os.getpid() is a system call on every request.
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


@functools.cache
def _instance_id(pid: int) -> str:
    revision = os.environ.get("K_REVISION")
    host = f"{socket.gethostname()}:{pid}"
    return f"{revision}/{host}" if revision else host


@contextmanager
def request_fields(fields: Mapping[str, Any]) -> Iterator[None]:
    """Add ``fields`` to the execution line of every request served inside this block."""
    token = _REQUEST_FIELDS.set(fields)
    try:
        yield
    finally:
        _REQUEST_FIELDS.reset(token)


def note_error(error: BaseException) -> None:
    """Put ``error``'s stack trace into this request's execution line, rather than a line of
    its own: every request writes exactly one line."""
    _PENDING_ERROR.set(error)


def log_execution(
    message: str,
    fields: dict[str, Any],
    level: int = logging.INFO,
    error: BaseException | None = None,
) -> None:
    """Write the one structured line that every request to the worker produces (with the
    stack trace of ``error``, if any, inside that same line)."""
    extra = _REQUEST_FIELDS.get()
    if extra:
        fields = {**extra, **fields}
    pending = _PENDING_ERROR.get()
    if pending is not None:
        _PENDING_ERROR.set(None)
        error = error or pending
    logger = _EXECUTION_LOG
    handler = _own_json_handler
    if error is None and handler is not None and _only_to(handler, logger, level):
        # The line every request writes, straight to the handler's stream: the same JSON the
        # formatter makes, without a LogRecord and the logging machinery (a quarter of the
        # protocol's cost per request, bench/worker_throughput.py).
        line = json_line(level, message, datetime.now(UTC), EXECUTION_LOGGER, fields)
        handler.acquire()
        try:
            handler.stream.write(line + handler.terminator)
            handler.flush()
        except Exception:  # A full disk or closed pipe must not fail the request: as logging.
            handler.handleError(logging.makeLogRecord({"msg": message, "levelno": level}))
        finally:
            handler.release()
        return
    logger.log(level, message, exc_info=error, extra={FIELDS_ATTRIBUTE: fields})


def _only_to(handler: logging.Handler, logger: logging.Logger, level: int) -> bool:
    """Whether a record from ``logger`` at ``level`` would reach ``handler`` and nothing else,
    unfiltered: then writing to it directly is what logging would have done."""
    parent = logger.parent
    return (
        logger.isEnabledFor(level)
        and level >= handler.level
        and not logger.handlers
        and not logger.filters
        and logger.propagate
        and parent is not None
        and parent.name == "tasklease"
        and not parent.propagate
        and not parent.filters
        and parent.handlers == [handler]
        and not handler.filters
    )
