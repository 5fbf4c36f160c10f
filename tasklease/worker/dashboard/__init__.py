"""The operators' web page: runs with filters, a run's detail, stuck runs, release, replay and
cancel.

Server-rendered (Flask + Jinja, no JavaScript), over the same
:class:`~tasklease.worker.operate.operations.Operations` as ``tasklease runs``. Standalone:
``tasklease dashboard`` (loopback, no login, answering loopback ``Host`` names only); inside
the worker: ``create_app(..., dashboard="/tasklease")``, behind OIDC for the operators named.

Here: the blueprint and its two mounts. The pages are :mod:`.views` (the summary's
:mod:`.summary`, the pictures :mod:`.charts`, the outbox's :mod:`.outbox`), what each request passes
first :mod:`.guard`, the forms' tokens :mod:`.csrf`, the operators' check :mod:`.operators`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import flask

from tasklease.errors import ConfigurationError, StoreUnavailable
from tasklease.jobs import Job
from tasklease.plumbing.hosts import LOOPBACK_HOSTS, allowed_host_names
from tasklease.worker.auth.authenticators import Authenticator
from tasklease.worker.dashboard.csrf import CSRF_COOKIE, CSRF_FIELD, Csrf
from tasklease.worker.dashboard.guard import Guard
from tasklease.worker.dashboard.operators import OperatorAuth
from tasklease.worker.dashboard.outbox import OutboxView, locate
from tasklease.worker.dashboard.summary import SummaryView
from tasklease.worker.dashboard.views import Views
from tasklease.worker.handlers.router import HandlerSpec
from tasklease.worker.operate.operations import Operations
from tasklease.worker.stores.base.store import LeaseStore


def dashboard_blueprint(
    store: LeaseStore,
    *,
    auth: OperatorAuth | None = None,
    schedules: list[Job] | None = None,
    producer: Any = None,
    name: str = "tasklease_dashboard",
    allowed_hosts: frozenset[str] | None = None,
    csrf_secret: str | None = None,
    outbox: str | None = None,
) -> flask.Blueprint:
    """The dashboard as a blueprint; register it with ``url_prefix``.

    ``auth`` None serves everyone (the standalone, loopback dashboard); it then answers only
    ``Host`` names in ``allowed_hosts`` (default: loopback names). ``producer``: a
    :class:`tasklease.producer.Producer` or a factory for replays (default: ``Producer.from_env``).
    ``csrf_secret``: signs the forms' tokens (default ``TASKLEASE_DASHBOARD_SECRET``, else
    random per process). ``outbox``: the outbox's URL for its page (default
    ``TASKLEASE_OUTBOX_URL``, else the SQLite store's file when it has the table; "" none).
    """
    if allowed_hosts is None and auth is None:
        allowed_hosts = LOOPBACK_HOSTS
    csrf = Csrf(csrf_secret)
    operations = Operations(store, producer)
    views = Views(operations, schedules=schedules, name=name, csrf=csrf)
    guard = Guard(auth=auth, hosts=allowed_hosts, csrf=csrf, name=name)
    blueprint = flask.Blueprint(name, __name__, template_folder="templates")
    blueprint.before_request(guard.check)
    blueprint.after_request(guard.headers)
    blueprint.add_url_rule("/", "runs", views.runs, methods=["GET"])
    blueprint.add_url_rule("/stuck", "stuck", views.stuck, methods=["GET"])
    blueprint.add_url_rule("/summary", "summary", SummaryView(operations).summary, methods=["GET"])
    blueprint.add_url_rule("/runs/<run_id>", "run", views.run, methods=["GET"])
    blueprint.add_url_rule("/runs/<run_id>/<action>", "confirm", views.confirm, methods=["GET"])
    blueprint.add_url_rule("/runs/<run_id>/release", "release", views.release, methods=["POST"])
    blueprint.add_url_rule("/runs/<run_id>/replay", "replay", views.replay, methods=["POST"])
    blueprint.add_url_rule("/runs/<run_id>/signal", "signal", views.signal, methods=["POST"])
    blueprint.add_url_rule("/runs/<run_id>/cancel", "cancel", views.cancel, methods=["POST"])
    outbox_view = OutboxView(locate(outbox, store), csrf=csrf)
    blueprint.add_url_rule("/outbox", "outbox", outbox_view.page, methods=["GET"])
    blueprint.add_url_rule(
        "/outbox/requeue", "outbox_requeue", outbox_view.requeue, methods=["POST"]
    )
    blueprint.context_processor(lambda: {"outbox_nav": outbox_view.configured})
    blueprint.register_error_handler(StoreUnavailable, views.unavailable)
    return blueprint


def create_dashboard_app(
    store: LeaseStore,
    *,
    schedules: list[Job] | None = None,
    producer: Any = None,
    auth: OperatorAuth | None = None,
    host: str = "127.0.0.1",
    allowed_hosts: Iterable[str] = (),
    csrf_secret: str | None = None,
    outbox: str | None = None,
) -> flask.Flask:
    """The standalone dashboard (``tasklease dashboard``): the blueprint at ``/``. It answers
    only ``Host`` names that are loopback, ``host`` (its bind address) or ``allowed_hosts``."""
    app = flask.Flask("tasklease_dashboard")
    blueprint = dashboard_blueprint(
        store,
        auth=auth,
        schedules=schedules,
        producer=producer,
        allowed_hosts=allowed_host_names(host, allowed_hosts),
        csrf_secret=csrf_secret,
        outbox=outbox,
    )
    app.register_blueprint(blueprint)
    return app


def mount(
    app: flask.Flask,
    prefix: str,
    store: LeaseStore,
    authenticator: Authenticator,
    *,
    operators: Iterable[str] | None = None,
    audience: str | None = None,
    deliveries: Iterable[HandlerSpec] = (),
    csrf_secret: str | None = None,
) -> None:
    """Mount the dashboard in a worker app at ``prefix``, behind ``authenticator``, for
    ``operators`` (required with authentication on) with tokens for ``audience`` (default:
    the worker's). An operator that also delivers one of ``deliveries`` needs an audience of
    its own (:meth:`OperatorAuth.check_apart_from`)."""
    if not prefix.startswith("/") or prefix.rstrip("/") in ("", "/tasks", "/jobs"):
        raise ConfigurationError(f"dashboard prefix {prefix!r}: use a path such as /tasklease")
    operator_list = tuple(o.strip() for o in operators if o.strip()) if operators else None
    auth = OperatorAuth(authenticator, operator_list, audience)
    auth.check_apart_from(deliveries)
    blueprint = dashboard_blueprint(store, auth=auth, csrf_secret=csrf_secret)
    app.register_blueprint(blueprint, url_prefix=prefix.rstrip("/"))


__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "OperatorAuth",
    "create_dashboard_app",
    "dashboard_blueprint",
    "mount",
]
