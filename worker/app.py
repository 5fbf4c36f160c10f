"""The Flask application that serves a router's handlers."""

from __future__ import annotations

import logging

import flask

from worker import constants as c
from worker.auth import Authenticator, OidcAuth, authenticator_for
from worker.execution import Clock, Executor, utc_now
from worker.logs import configure_logging
from worker.router import Router
from worker.stores import LeaseStore, check_store_is_shared, store_from_url
from worker.wsgi_routes import DeliveryRoutes

_log = logging.getLogger("tasklease.app")

EXECUTOR_EXTENSION = "tasklease"  # app.extensions key holding the Executor.


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

    # Deliveries are answered in front of Flask (worker.wsgi_routes); the rest is Flask's.
    app.wsgi_app = DeliveryRoutes(app.wsgi_app, executor)  # type: ignore[method-assign]
    app.add_url_rule("/healthz", "tasklease_health", lambda: {"status": "ok"}, methods=["GET"])
    _log.info(
        "tasklease worker ready",
        extra={"tasklease": {"handlers": [spec.path for spec in router], "store": repr(store)}},
    )
    return app


__all__ = ["create_app"]
