"""The Flask application that serves a router's handlers."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Unpack

import flask
from werkzeug.exceptions import HTTPException

from tasklease import protocol
from tasklease.errors import ConfigurationError
from tasklease.plumbing.keywords import refuse_unknown_options
from tasklease.worker.auth.authenticators import Authenticator, NoAuth, OidcAuth, authenticator_for
from tasklease.worker.delivery.executor import Executor, Reply
from tasklease.worker.handlers.router import Router
from tasklease.worker.observe import telemetry
from tasklease.worker.observe.logs import configure_logging, request_fields
from tasklease.worker.observe.tally_flusher import DeliveryCounter
from tasklease.worker.serving import fallback
from tasklease.worker.serving.options import WorkerOptions, WorkerSettings
from tasklease.worker.serving.signal_route import register_signal_route
from tasklease.worker.serving.wsgi_routes import DeliveryRoutes
from tasklease.worker.stores import LeaseStore, check_store_is_shared, store_from_url
from tasklease.worker.stores.base.locks import LockStore
from tasklease.worker.stores.base.queries import operator_queries
from tasklease.worker.stores.base.tally import DeliveryTally
from tasklease.worker.stores.base.transactional import TRANSACTIONAL_STORES, TransactionalStore

_log = logging.getLogger("tasklease.app")

EXECUTOR_EXTENSION = "tasklease"  # app.extensions key holding the Executor.
ROUTES_EXTENSION = "tasklease.routes"  # ... and the DeliveryRoutes (tasklease.worker.asgi's).


def create_app(
    router: Router,
    store: LeaseStore | str | None = None,
    auth: str | Authenticator | None = None,
    **options: Unpack[WorkerOptions],
) -> flask.Flask:
    """A Flask app serving ``router``: ``POST /tasks/<name>`` and ``POST /jobs/<name>``.

    - ``store``: a :class:`LeaseStore`, a store URL, or None for ``TASKLEASE_STORE`` (default:
      a SQLite file in the working directory).
    - ``auth``: ``"oidc"`` (the default, configured from the environment), ``"none"`` (turns
      authentication off, with a warning), or an :class:`Authenticator`. None reads
      ``TASKLEASE_AUTH``.
    - ``options``: by keyword, those of :class:`~tasklease.worker.WorkerOptions` (``audience``,
      ``clock``, ``dashboard``, ``max_task_bytes``, ...); an unknown one is a TypeError.
    """
    refuse_unknown_options(create_app, options, WorkerOptions.__optional_keys__)
    settings = WorkerSettings(**options)
    configure_logging()
    registry = _configure_opentelemetry()
    if not isinstance(store, LeaseStore):
        store = store_from_url(store)
    check_store_is_shared(store)
    dashboard = settings.dashboard
    if dashboard is None:
        dashboard = os.environ.get(protocol.ENV_DASHBOARD) or None
    check_store_capabilities(router, store, dashboard)
    authenticator = authenticator_for(auth, settings.audience)
    if isinstance(authenticator, OidcAuth):
        authenticator.check_configuration(router)
    executor = Executor(
        router,
        store,
        authenticator,
        clock=settings.clock,
        project_header=settings.project_header,
        location_header=settings.location_header,
    )
    if isinstance(store, DeliveryTally):  # Counts for the dashboard's deliveries chart.
        executor.tally = DeliveryCounter(store, settings.clock)
    own_app = settings.app is None
    app = settings.app or flask.Flask("tasklease")
    app.extensions[EXECUTOR_EXTENSION] = executor
    # With authentication off, every line says so: nobody should read such a log as verified.
    fields: dict[str, Any] = {"auth": "none"} if isinstance(authenticator, NoAuth) else {}

    def refused(error: HTTPException) -> HTTPException | flask.Response:
        # A user's own app keeps its own error pages outside tasklease's routes.
        is_ours = own_app or fallback.is_tasklease_path(flask.request.path)
        if not is_ours or error.code is None or error.code < 400:
            return error
        reply = fallback.reply_for_http_error(error)
        with request_fields(fields):
            fallback.log_reply(reply, time.monotonic())
        response = _respond(reply)
        allowed = getattr(error, "valid_methods", None)  # MethodNotAllowed's
        if allowed:
            response.headers["Allow"] = ", ".join(allowed)
        return response

    app.register_error_handler(HTTPException, refused)

    # Deliveries are answered in front of Flask (tasklease.worker.serving.wsgi_routes); the rest
    # is Flask's, and the error handler above gives what Flask itself refuses one line and a
    # JSON answer.
    routes = DeliveryRoutes(
        app.wsgi_app, executor, fields, max_body_bytes=_max_task_bytes(settings.max_task_bytes)
    )
    app.wsgi_app = routes  # type: ignore[method-assign]
    app.extensions[ROUTES_EXTENSION] = routes
    app.add_url_rule("/healthz", "tasklease_health", lambda: {"status": "ok"}, methods=["GET"])
    register_signal_route(app, executor)
    if dashboard:
        from tasklease.worker.dashboard import mount  # noqa: PLC0415 - only when asked for.

        operators = settings.dashboard_operators
        if operators is None and os.environ.get(protocol.ENV_DASHBOARD_OPERATORS):
            operators = os.environ[protocol.ENV_DASHBOARD_OPERATORS].split(",")
        board_audience = (
            settings.dashboard_audience or os.environ.get(protocol.ENV_DASHBOARD_AUDIENCE) or None
        )
        mount(
            app,
            dashboard,
            store,
            authenticator,
            operators=operators,
            audience=board_audience,
            deliveries=list(router),
        )
    if registry is not None:  # TASKLEASE_METRICS=prometheus
        from tasklease.plumbing.otel_setup import metrics_view  # noqa: PLC0415 - loaded already.

        app.add_url_rule("/metrics", "tasklease_metrics", metrics_view(registry), methods=["GET"])
    _log.info(
        "tasklease worker ready",
        extra={
            "tasklease": {
                **fields,
                "handlers": [spec.path for spec in router],
                "store": repr(store),
            }
        },
    )
    return app


def check_store_capabilities(router: Router, store: LeaseStore, dashboard: str | None) -> None:
    """Refuse, at start, what ``store`` cannot serve: a handler that takes a lock
    (``exclusive``, ``concurrency_key``) on a store that keeps none, or the dashboard on a
    store without operator queries, or a ``transactional`` handler on a store that is not a
    TransactionalStore. Found after a claim, any would be a 500 per delivery."""
    if not isinstance(store, LockStore):
        for spec in router:
            if spec.exclusive or spec.concurrency_key is not None:
                needs = "is exclusive" if spec.exclusive else "has a concurrency_key"
                raise ConfigurationError(
                    f"handler {spec.path} {needs}, which needs a store that keeps locks, but "
                    f"{store!r} does not implement LockStore"
                )
    if not isinstance(store, TransactionalStore):
        for spec in router:
            if spec.transactional:
                raise ConfigurationError(
                    f"handler {spec.path} is transactional=True, which needs a store that "
                    f"runs it in its own transaction, but {store!r} does not implement "
                    f"TransactionalStore: use {TRANSACTIONAL_STORES}"
                )
    if dashboard:
        operator_queries(store, f"the dashboard at {dashboard!r}")


def _configure_opentelemetry() -> Any:
    """Install the SDK the environment asks for; the Prometheus registry to serve, if any."""
    registry = None
    if any(name in os.environ for name in protocol.ENV_OTEL_SETUP):
        from tasklease.plumbing import otel_setup  # noqa: PLC0415 - only when configured.

        registry = otel_setup.configure_from_env("tasklease-worker").registry
    telemetry.opentelemetry_in_use()  # Loaded now if it can be used, not on a delivery.
    return registry


def _max_task_bytes(configured: int | None) -> int:
    """The body limit: ``configured``, else ``TASKLEASE_MAX_TASK_BYTES``, else Cloud Tasks'."""
    if configured is None:
        text = os.environ.get(protocol.ENV_MAX_TASK_BYTES, "").strip()
        if not text:
            return protocol.MAX_TASK_BYTES
        if not (text.isascii() and text.isdigit()):
            raise ConfigurationError(f"{protocol.ENV_MAX_TASK_BYTES}={text!r}: a number of bytes")
        configured = int(text)
    if isinstance(configured, bool) or not isinstance(configured, int) or configured <= 0:
        raise ConfigurationError(f"max_task_bytes={configured!r}: a positive number of bytes")
    return configured


def _respond(reply: Reply) -> flask.Response:
    response = flask.Response(reply.body_bytes(), reply.status, mimetype="application/json")
    response.headers.update(reply.headers())
    if reply.status == 405:
        response.headers["Allow"] = "POST"
    return response


__all__ = ["create_app"]
