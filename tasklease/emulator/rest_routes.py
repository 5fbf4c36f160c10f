"""A REST API's routing table: resource patterns with their ``:verb`` and HTTP method, each
mapped to the call that answers it, served as one Flask view in Google's JSON error shape.

A pattern is a googleapis HTTP binding's path with ``*`` for one segment, such as
``projects/*/locations/*/queues/*``; a request matches a route when its resource (the URL
path below the API's version) has that shape, its method is the route's and its verb (what
follows ``:``) is the route's, none for most.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flask

from tasklease.emulator.errors import ApiError

_log = logging.getLogger("tasklease.emulator")

Json = dict[str, Any]


class RestCall:
    """The request a route answers: its resource, the URL's query and the JSON body."""

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.segments = resource.split("/")

    @property
    def parent(self) -> str:
        """The resource less its last segment: the location of a queues collection, the
        queue of a tasks collection."""
        return self.resource.rsplit("/", 1)[0]

    def arg(self, name: str, default: str = "") -> str:
        return flask.request.args.get(name) or default

    @property
    def update_mask(self) -> str | None:
        """The ``updateMask`` query parameter of an Update call, None when absent."""
        return flask.request.args.get("updateMask")

    def int_arg(self, name: str) -> int:
        """A whole-number query parameter (0 when absent); INVALID_ARGUMENT otherwise."""
        value = self.arg(name, "0")
        try:
            return int(value)
        except ValueError as exc:
            raise ApiError(400, f"invalid {name}: {value!r}") from exc

    def body(self) -> Json:
        """The request's JSON object ({} when empty); INVALID_ARGUMENT otherwise."""
        if not flask.request.data:
            return {}
        try:
            body = json.loads(flask.request.data)
        except ValueError as exc:
            raise ApiError(400, f"request body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        return body


Answer = Callable[[RestCall], Json]


@dataclass(frozen=True)
class _Route:
    shape: re.Pattern[str]
    method: str
    verb: str
    answer: Answer


class RestRoutes:
    """The routes of one API version (``/v2/...``, ``/v1/...``), declared with :meth:`add`."""

    def __init__(self) -> None:
        self._routes: list[_Route] = []

    def add(self, method: str, pattern: str, answer: Answer, *, verb: str = "") -> None:
        """Answer ``method pattern[:verb]`` with ``answer(call)``, whose JSON is the 200 body."""
        segments = (
            "[^/]+" if segment == "*" else re.escape(segment) for segment in pattern.split("/")
        )
        self._routes.append(_Route(re.compile("/".join(segments)), method, verb, answer))

    def view(self, resource: str) -> flask.Response:
        """The Flask view of ``<path:resource>``: the route's answer, or Google's JSON error
        (NOT_FOUND for a request no route takes, INTERNAL for the emulator's own bugs)."""
        method = flask.request.method
        try:
            status, body = 200, self._answer(method, resource)
        except ApiError as exc:
            status, body = exc.code, exc.body()
        except Exception as exc:  # Google's JSON error shape even for the emulator's own bugs.
            _log.exception("%s %s failed", method, resource)
            error = ApiError(500, f"internal error: {type(exc).__name__}", "INTERNAL")
            status, body = error.code, error.body()
        return json_response(status, body)

    def _answer(self, method: str, resource: str) -> Json:
        resource, _, verb = resource.partition(":")
        for route in self._routes:
            if route.method == method and route.verb == verb and route.shape.fullmatch(resource):
                return route.answer(RestCall(resource))
        raise ApiError(404, f"no method {method} {resource}{':' + verb if verb else ''}")


def json_response(status: int, body: Json) -> flask.Response:
    return flask.Response(json.dumps(body), status=status, content_type="application/json")
