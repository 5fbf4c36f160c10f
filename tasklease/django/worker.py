"""The worker behind ``tasklease.django.urls``: built once, on the first delivery, from
Django settings (each unset one from its environment variable, as ``create_app`` reads them).

- ``TASKLEASE_STORE``: a store URL or :class:`LeaseStore` (default ``TASKLEASE_STORE``).
- ``TASKLEASE_AUTH``: ``"oidc"`` (default), ``"none"``, or an :class:`Authenticator`.
- ``TASKLEASE_AUDIENCE``: the OIDC audience, the worker's root URL (mount prefix included).
- ``TASKLEASE_ROUTER``: ``"module:attribute"``, a :class:`Router` of your own handlers to
  serve too (the Django task handler is added to it).
- ``TASKLEASE_MAX_TASK_BYTES``: the largest body a delivery may have (default 1 MiB).
"""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

from tasklease.django.handler import register
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import ROUTES_EXTENSION, create_app
from tasklease.worker.serving.router_reference import load_router
from tasklease.worker.serving.wsgi_routes import DeliveryRoutes

SETTINGS = (
    "TASKLEASE_STORE",
    "TASKLEASE_AUTH",
    "TASKLEASE_AUDIENCE",
    "TASKLEASE_ROUTER",
    "TASKLEASE_MAX_TASK_BYTES",
)

_lock = threading.Lock()
_routes: DeliveryRoutes | None = None


def routes() -> DeliveryRoutes:
    """The delivery routes (executor, log fields, body limit), built on first use."""
    global _routes  # noqa: PLW0603 - one worker per process, as under gunicorn.
    with _lock:
        if _routes is None:
            _routes = _build()
        return _routes


def reset() -> None:
    """Forget the worker: the next delivery builds it from the settings again."""
    global _routes  # noqa: PLW0603
    with _lock:
        _routes = None


def _build() -> DeliveryRoutes:
    reference = _setting("TASKLEASE_ROUTER")
    router = load_router(reference) if reference else Router()
    if not isinstance(router, Router):
        raise TypeError(
            f"TASKLEASE_ROUTER={reference!r} names a {type(router).__name__}, not a Router"
        )
    app = create_app(
        register(router),
        _setting("TASKLEASE_STORE"),
        _setting("TASKLEASE_AUTH"),
        audience=_setting("TASKLEASE_AUDIENCE"),
        max_task_bytes=_setting("TASKLEASE_MAX_TASK_BYTES"),
    )
    built: DeliveryRoutes = app.extensions[ROUTES_EXTENSION]
    return built


def _setting(name: str) -> Any:
    return getattr(settings, name, None)


def _changed(*, setting: str, **_: Any) -> None:
    if setting in SETTINGS:  # override_settings in tests: the next delivery sees them.
        reset()


setting_changed.connect(_changed, dispatch_uid="tasklease.django.worker")
