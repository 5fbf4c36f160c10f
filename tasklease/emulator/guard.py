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

import flask

from tasklease.plumbing.hosts import LOOPBACK_HOSTS, WILDCARD_HOSTS, allowed_host_names, host_name

# The one state-changing method a browser sends cross-origin without asking first.
_SIMPLE_STATE_CHANGING = frozenset({"POST"})
_JSON_TYPES = frozenset({"application/json", "application/grpc"})


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


def _error(code: int, status: str, message: str) -> flask.Response:
    body = {"error": {"code": code, "message": message, "status": status}}
    return flask.Response(json.dumps(body), status=code, content_type="application/json")


__all__ = [
    "LOOPBACK_HOSTS",
    "WILDCARD_HOSTS",
    "allowed_host_names",
    "host_name",
    "install",
]
