"""Keep web pages from driving the emulator.

A page in the developer's browser may send a "simple" cross-origin request to 127.0.0.1 (a
POST with ``text/plain``, form or no content type) without a CORS preflight, and with DNS
rebinding it can send any request under its own host name. The emulator creates tasks and
mints OIDC tokens for whatever account and audience a task names, so it refuses both: every
request must name a loopback host (or a configured one), and every POST must be
``application/json``, which a browser only sends cross-origin after a preflight the emulator
never approves. PATCH, PUT and DELETE are always preflighted, whatever their content type;
gcloud sends its DELETEs without one (checked with gcloud 528 against this emulator), while
``google-cloud-tasks`` over REST sends JSON on every call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import flask

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})  # noqa: S104 - recognised, not bound
# The one state-changing method a browser sends cross-origin without asking first.
_SIMPLE_STATE_CHANGING = frozenset({"POST"})
_JSON_TYPES = frozenset({"application/json", "application/grpc"})
# host, [v6 host], with an optional port; nothing else may be in a Host header.
_HOST_HEADER = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::\d{1,5})?")


def allowed_host_names(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """Loopback names, the host the emulator binds to (unless a wildcard) and ``extra``."""
    names = {bind_host.strip("[]").lower()} - WILDCARD_HOSTS
    return LOOPBACK_HOSTS | names | {name.strip("[]").lower() for name in extra}


def install(app: flask.Flask, allowed_hosts: frozenset[str]) -> None:
    """Refuse foreign Host headers and non-JSON state changes before any route runs."""

    @app.before_request
    def guard() -> flask.Response | None:
        request = flask.request
        host = host_name(request.headers.get("Host", ""))
        if host is None or host not in allowed_hosts:
            return _error(403, "PERMISSION_DENIED", "Host header is not an allowed host name")
        if request.method in _SIMPLE_STATE_CHANGING and request.mimetype not in _JSON_TYPES:
            return _error(415, "INVALID_ARGUMENT", "a POST must be Content-Type: application/json")
        return None


def host_name(header: str) -> str | None:
    """The lower-cased host of a Host header without its port; None if it is malformed."""
    match = _HOST_HEADER.fullmatch(header)
    if match is None:
        return None
    return (match.group("v6") or match.group("name")).lower()


def _error(code: int, status: str, message: str) -> flask.Response:
    body = {"error": {"code": code, "message": message, "status": status}}
    return flask.Response(json.dumps(body), status=code, content_type="application/json")
