"""The router a ``module:attribute`` reference names (``TASKLEASE_ROUTER``, ``tasklease dev
--router``, the Django backend's ``ROUTER`` option), with an error naming the fix when it does
not name one."""

from __future__ import annotations

import difflib
import importlib

import flask

from tasklease import protocol
from tasklease.errors import ConfigurationError
from tasklease.worker.handlers.router import Router


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
