"""``gunicorn 'tasklease.worker.wsgi:app'``: the app for the router named by ``TASKLEASE_ROUTER``.

``TASKLEASE_ROUTER=module:attribute`` names a :class:`tasklease.worker.Router` (or a ready
Flask app); the store and authentication come from ``TASKLEASE_STORE`` and ``TASKLEASE_AUTH``.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys

import flask

from tasklease import protocol
from tasklease.errors import ConfigurationError
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app


def load_router(reference: str) -> Router | flask.Flask:
    """Import ``module:attribute`` and return what it names."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(
            f"{protocol.ENV_ROUTER}={reference!r}: use module:attribute, "
            "e.g. tasklease.demo.shop:router"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise  # The module exists; something it imports does not.
        raise ConfigurationError(
            f"{reference}: no module named {exc.name!r} (is your project installed? "
            "pip install -e . in its directory)"
        ) from None
    if not hasattr(module, attribute):
        names = [name for name in vars(module) if not name.startswith("_")]
        close = difflib.get_close_matches(attribute, names, n=1)
        hint = f": did you mean {close[0]!r}?" if close else ""
        raise ConfigurationError(
            f"{reference}: module {module_name} found, but it has no attribute {attribute!r}{hint}"
        )
    target = getattr(module, attribute)
    if not isinstance(target, (Router, flask.Flask)):
        raise ConfigurationError(
            f"{reference} is a {type(target).__name__}, not a tasklease.Router (or a Flask app)"
        )
    return target


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
