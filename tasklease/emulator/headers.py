"""The headers a target receives: what a task or a job may set, and what the service sets.

Cloud Tasks' HttpRequest.headers (google/cloud/tasks/v2/target.proto, in google-cloud-tasks'
``tasks_v2/types/target.py``) lists headers that "will be ignored or replaced": ``Host``
(derived from the URL), ``Content-Length`` (computed), ``User-Agent`` (set to
``Google-Cloud-Tasks``), ``X-Google-*`` and ``X-AppEngine-*`` (Google use only); the queue's
HttpTarget.header_overrides adds the predefined ``X-CloudTasks-*`` headers. Cloud Scheduler's
HttpTarget.headers (google/cloud/scheduler/v1/target.proto) lists the same, with
``User-Agent: Google-Cloud-Scheduler`` and ``X-CloudScheduler*``, and sets
``Content-Type: application/octet-stream`` for a job with a body and no Content-Type.

Header names are case-insensitive (RFC 9110 section 5.1): a lower-case ``x-cloudtasks-...``
is the service's header as much as the canonical spelling, and is dropped the same way.
``Transfer-Encoding`` frames the body as Content-Length does, so it is the sender's too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Computed by whoever sends the request: the message's framing and its target.
FRAMING = frozenset({"content-length", "transfer-encoding", "host"})
_TASK_IGNORED = FRAMING | {"user-agent"}
_TASK_PREFIXES = ("x-google-", "x-appengine-", "x-cloudtasks-")
_JOB_IGNORED = FRAMING | {"user-agent", "x-cloudscheduler"}
_JOB_PREFIXES = ("x-google-", "x-appengine-", "x-cloudscheduler-")
TASKS_USER_AGENT = "Google-Cloud-Tasks"
SCHEDULER_USER_AGENT = "Google-Cloud-Scheduler"
DEFAULT_JOB_CONTENT_TYPE = "application/octet-stream"


def task_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A task's (or a queue override's) headers less those Cloud Tasks ignores or sets."""
    return _without(headers, _TASK_IGNORED, _TASK_PREFIXES)


def job_headers(headers: Mapping[str, str], body: bytes) -> dict[str, str]:
    """A job's headers less those Cloud Scheduler ignores or sets, with its default
    Content-Type when the job has a body and none of its own."""
    kept = _without(headers, _JOB_IGNORED, _JOB_PREFIXES)
    if body and not any(name.lower() == "content-type" for name in kept):
        kept["Content-Type"] = DEFAULT_JOB_CONTENT_TYPE
    return kept


def set_header(headers: dict[str, str], name: str, value: str) -> None:
    """Set ``name`` to ``value``, replacing it in any spelling: one value for the target."""
    for existing in [key for key in headers if key.lower() == name.lower()]:
        del headers[existing]
    headers[name] = value


def without_framing(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` less Content-Length, Transfer-Encoding and Host: http.client computes
    them from the body and the URL. A caller's own Content-Length would end the request
    early on a kept-alive connection and make the rest of the body a second request."""
    return _without(headers, FRAMING, ())


def _without(
    headers: Mapping[str, str], names: frozenset[str], prefixes: Iterable[str]
) -> dict[str, str]:
    prefixes = tuple(prefixes)
    return {
        name: value
        for name, value in headers.items()
        if name.lower() not in names and not name.lower().startswith(prefixes)
    }
