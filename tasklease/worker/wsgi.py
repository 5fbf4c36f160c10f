"""``gunicorn 'tasklease.worker.wsgi:app'``: the app for the router named by ``TASKLEASE_ROUTER``.

``TASKLEASE_ROUTER=module:attribute`` names a :class:`tasklease.worker.Router` (or a ready
Flask app); the store and authentication come from ``TASKLEASE_STORE`` and ``TASKLEASE_AUTH``.
"""

from __future__ import annotations

import os
import sys

import flask

from tasklease import protocol
from tasklease.errors import ConfigurationError
from tasklease.worker.serving.app import create_app
from tasklease.worker.serving.router_reference import load_router


def app_from_env() -> flask.Flask:
    """Build the app the environment describes."""
    reference = os.environ.get(protocol.ENV_ROUTER)
    if not reference:
        raise ConfigurationError(
            f"set {protocol.ENV_ROUTER}=module:attribute naming your tasklease.Router"
        )
    target = load_router(reference)
    return target if isinstance(target, flask.Flask) else create_app(target)


def __getattr__(name: str) -> flask.Flask:
    # Built on first access (gunicorn's), not at import: importing the module stays harmless.
    if name == "app":
        try:
            built = app_from_env()
        except ConfigurationError as exc:
            raise _boot_error(exc) from None
        globals()["app"] = built
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _boot_error(error: ConfigurationError) -> Exception:
    """``error`` as gunicorn's worker boot reports it, when gunicorn is loading the app: an
    AppImportError is printed as one line and stops the arbiter (gunicorn/arbiter.py
    spawn_worker), where any other error is logged as tracebacks, once per worker."""
    if "gunicorn.arbiter" not in sys.modules:
        return error
    from gunicorn.errors import AppImportError  # noqa: PLC0415 - only under gunicorn.

    boot_error: Exception = AppImportError(f"tasklease: {error}")
    return boot_error
