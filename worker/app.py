"""The Flask application that serves a router's handlers."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import flask
from werkzeug.datastructures import Headers

from worker import constants as c
from worker.auth import Authenticator, OidcAuth, authenticator_for
from worker.execution import Clock, Delivery, Executor, Reply, utc_now
from worker.identity import HeaderLookup, Kind
from worker.logs import configure_logging
from worker.router import Router
from worker.stores import LeaseStore, check_store_is_shared, store_from_url

_log = logging.getLogger("tasklease.app")

EXECUTOR_EXTENSION = "tasklease"  # app.extensions key holding the Executor.
# Routes accept every method so that a wrong one is answered (405) and logged like any
# other rejected delivery, with the outcome header.
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def create_app(
    router: Router,
    store: LeaseStore | str | None = None,
    auth: str | Authenticator | None = None,
    *,
    clock: Clock = utc_now,
    project_header: str = c.PROJECT_HEADER,
    location_header: str = c.LOCATION_HEADER,
    app: flask.Flask | None = None,
) -> flask.Flask:
    """A Flask app serving ``router``: ``POST /tasks/<name>`` and ``POST /jobs/<name>``.

    - ``store``: a :class:`LeaseStore`, a store URL, or None for ``TASKLEASE_STORE`` (default:
      a SQLite file in the working directory).
    - ``auth``: ``"oidc"`` (the default, configured from the environment), ``"none"`` (turns
      authentication off, with a warning), or an :class:`Authenticator`. None reads
      ``TASKLEASE_AUTH``.
    - ``app``: an existing Flask app to add the routes to, instead of a new one.
    """
    configure_logging()
    if not isinstance(store, LeaseStore):
        store = store_from_url(store)
    check_store_is_shared(store)
    authenticator = authenticator_for(auth)
    if isinstance(authenticator, OidcAuth):
        authenticator.check_configuration(router)
    executor = Executor(
        router,
        store,
        authenticator,
        clock=clock,
        project_header=project_header,
        location_header=location_header,
    )
    app = app or flask.Flask("tasklease")
    app.extensions[EXECUTOR_EXTENSION] = executor

    def serve(kind: Kind, name: str) -> flask.Response:
        return _respond(executor.execute(_delivery(kind, name)))

    app.add_url_rule(
        f"{c.TASK_ROUTE_PREFIX}<path:name>",
        "tasklease_task",
        lambda name: serve(Kind.TASK, name),
        methods=_ALL_METHODS,
    )
    app.add_url_rule(
        f"{c.SCHEDULER_ROUTE_PREFIX}<path:name>",
        "tasklease_job",
        lambda name: serve(Kind.SCHEDULER, name),
        methods=_ALL_METHODS,
    )
    app.add_url_rule("/healthz", "tasklease_health", lambda: {"status": "ok"}, methods=["GET"])
    _log.info(
        "tasklease worker ready",
        extra={"tasklease": {"handlers": [spec.path for spec in router], "store": repr(store)}},
    )
    return app


def _delivery(kind: Kind, name: str) -> Delivery:
    request = flask.request
    return Delivery(
        kind=kind,
        handler=name,
        header=_header_lookup(request.headers),
        query=request.args.to_dict(),
        body=_read_body(request),
        url=_public_url(request),
        authorization=request.headers.get("Authorization"),
        method=request.method,
    )


def _header_lookup(headers: Headers) -> HeaderLookup:
    """Case-insensitive lookup of every value of a header.

    Built once per request: werkzeug's ``getlist`` scans the whole WSGI environ on each call,
    and the identity needs a dozen lookups.
    """
    values: dict[str, list[str]] = {}
    for name, value in headers.items():
        values.setdefault(name.lower(), []).append(value)

    def lookup(name: str) -> Sequence[str]:
        return values.get(name.lower(), ())

    return lookup


def _read_body(request: flask.Request) -> bytes | None:
    """The body, or None if it is larger than Cloud Tasks allows (read no further than that)."""
    length = request.content_length
    if length is not None and length > c.MAX_BODY_BYTES:
        return None
    body = request.stream.read(c.MAX_BODY_BYTES + 1)
    return None if len(body) > c.MAX_BODY_BYTES else body


def _public_url(request: flask.Request) -> str:
    """The URL as the caller addressed it: Cloud Run terminates TLS and says so in
    X-Forwarded-Proto, while the app itself sees plain HTTP."""
    proto = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    scheme = proto if proto in ("http", "https") else request.scheme
    url = f"{scheme}://{request.host}{request.path}"
    query = request.query_string.decode("latin-1")
    return f"{url}?{query}" if query else url


def _respond(reply: Reply) -> flask.Response:
    response = flask.Response(reply.body_bytes(), reply.status, mimetype="application/json")
    response.headers.update(reply.headers())
    if reply.status == 405:
        response.headers["Allow"] = "POST"
    return response


__all__ = ["create_app"]
