"""``gunicorn 'tasklease.worker.wsgi:app'``: the app for the router named by ``TASKLEASE_ROUTER``.

``TASKLEASE_ROUTER=module:attribute`` names a :class:`tasklease.worker.Router` (or a ready
Flask app); the store and authentication come from ``TASKLEASE_STORE`` and ``TASKLEASE_AUTH``.
"""

from __future__ import annotations

import importlib
import os

import flask

from tasklease import protocol
from tasklease.errors import ConfigurationError
from tasklease.worker.app import create_app
from tasklease.worker.router import Router


def load_router(reference: str) -> Router | flask.Flask:
    """Import ``module:attribute`` and return what it names."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(
            f"{protocol.ENV_ROUTER}={reference!r}: use module:attribute, "
            "e.g. tasklease.demo.shop:router"
        )
    target = getattr(importlib.import_module(module_name), attribute, None)
    if not isinstance(target, (Router, flask.Flask)):
        raise ConfigurationError(f"{reference} is not a tasklease.Router (or a Flask app)")
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
        built = app_from_env()
        globals()["app"] = built
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
