"""The worker's options, written once: :func:`~tasklease.worker.create_app` and
:func:`~tasklease.worker.asgi.create_asgi_app` both take them as ``**options``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from tasklease import protocol
from tasklease.worker.runtime.clock import Clock, utc_now

if TYPE_CHECKING:
    import flask

__all__ = ["WorkerOptions", "WorkerSettings"]


class WorkerOptions(TypedDict, total=False):
    """The options of :func:`~tasklease.worker.create_app` (and of
    :func:`~tasklease.worker.asgi.create_asgi_app`), all by keyword and all optional: an
    unknown one is a TypeError naming the known ones."""

    clock: Clock
    """What the worker reads the time from (default: the system's UTC clock). A test that
    sets its own ``now`` gives the same function here (a manual run is told by it)."""

    project_header: str
    """The request header carrying the task's project (default ``X-Tasklease-Project``;
    neither Cloud Tasks nor Cloud Scheduler sends one: the target sets it, or the query)."""

    location_header: str
    """The request header carrying the task's location (default ``X-Tasklease-Location``)."""

    app: flask.Flask | None
    """An existing Flask app to add the routes to, instead of a new one."""

    audience: str | None
    """The OIDC token audience (overrides ``TASKLEASE_AUDIENCE``), normally the worker's root
    URL. With OIDC on, it (or a per-handler audience) is required."""

    dashboard: str | None
    """A path such as ``"/tasklease"`` to serve the operators' dashboard at (default
    ``TASKLEASE_DASHBOARD``; off when unset). Its forms need a CSRF token signed with
    ``TASKLEASE_DASHBOARD_SECRET`` (else a per-process secret)."""

    dashboard_operators: Iterable[str] | None
    """The accounts whose OIDC ID tokens the dashboard takes (default
    ``TASKLEASE_DASHBOARD_OPERATORS``, comma-separated; required with the dashboard: the
    deliveries' accounts are never let in by default)."""

    max_task_bytes: int | None
    """The largest body a delivery may have (default ``TASKLEASE_MAX_TASK_BYTES``, else 1 MiB,
    Cloud Tasks' maximum task size); larger ones are answered 413 unread."""

    dashboard_audience: str | None
    """The audience of the dashboard's ID tokens (default ``TASKLEASE_DASHBOARD_AUDIENCE``,
    else the worker's audience; required to differ from it when an operator also delivers
    tasks)."""


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    """:class:`WorkerOptions` with the default of each option not given: the one place the
    defaults are written (a default read from the environment is read where it is used)."""

    clock: Clock = utc_now
    project_header: str = protocol.PROJECT_HEADER
    location_header: str = protocol.LOCATION_HEADER
    app: flask.Flask | None = None
    audience: str | None = None
    dashboard: str | None = None
    dashboard_operators: Iterable[str] | None = None
    max_task_bytes: int | None = None
    dashboard_audience: str | None = None
