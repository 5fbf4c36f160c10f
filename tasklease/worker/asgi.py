"""The worker as an ASGI app, for uvicorn (or any ASGI server) and for mounting in FastAPI or
Starlette: ``pip install 'tasklease[asgi]'``.

    app = create_asgi_app(router, store="sqlite:///runs.db")      # uvicorn module:app
    fastapi_app.mount("/worker", create_asgi_app(router, ...))     # or inside FastAPI

``uvicorn --factory tasklease.worker.asgi:app_from_env`` builds it from the environment, as
``gunicorn tasklease.worker.wsgi:app`` does. The deliveries are answered by the same executor
as under WSGI (same OIDC, answers, log line, traces and metrics); every store call and every
handler runs in a worker thread, never on the server's event loop, and ``async def`` handlers
are awaited on tasklease's own handler loop (:mod:`tasklease.worker.runtime.event_loop`), so a
loop-bound client a handler uses must be created by the handlers, not by the server's
lifespan. The exception is a store that never waits (MemoryStore) with authentication off
and no OpenTelemetry: there an ``async def`` handler's whole delivery runs on the server's
loop, without a thread (:mod:`tasklease.worker.delivery.flow`). The dashboard, ``/metrics``
and the Flask app's other routes are served too, by a small WSGI bridge
(:mod:`tasklease.worker.serving.asgi_wsgi`).
"""

from __future__ import annotations

import os
from typing import Unpack, cast

import flask

from tasklease import protocol
from tasklease.errors import ConfigurationError
from tasklease.plumbing.keywords import refuse_unknown_options
from tasklease.worker.auth.authenticators import Authenticator
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import ROUTES_EXTENSION, create_app
from tasklease.worker.serving.asgi_routes import ASGIApp, AsgiDeliveries
from tasklease.worker.serving.asgi_wsgi import WsgiBridge
from tasklease.worker.serving.options import WorkerOptions
from tasklease.worker.serving.router_reference import load_router
from tasklease.worker.stores import LeaseStore

DEFAULT_THREADS = 40  # anyio's own default: deliveries at once, each holding a thread.


class AsgiOptions(WorkerOptions, total=False):
    """The options of :func:`create_asgi_app`: :class:`~tasklease.worker.WorkerOptions`
    (``app`` is a Flask app whose other routes it serves too) and ``threads``."""

    threads: int
    """How many deliveries run at once, each in a worker thread; more wait, off the loop
    (default 40, anyio's own)."""


def create_asgi_app(
    router: Router,
    store: LeaseStore | str | None = None,
    auth: str | Authenticator | None = None,
    **options: Unpack[AsgiOptions],
) -> AsgiDeliveries:
    """An ASGI app serving ``router``: ``POST /tasks/<name>``, ``POST /jobs/<name>`` and
    ``GET /healthz``, under whatever prefix it is mounted at (``root_path``).

    ``router``, ``store`` and ``auth`` are :func:`tasklease.worker.create_app`'s; the options
    are :class:`AsgiOptions`, by keyword (an unknown one is a TypeError). A mounted handler's
    default OIDC audience is its whole URL, mount prefix included, as Cloud Tasks computes it.
    """
    refuse_unknown_options(create_asgi_app, options, AsgiOptions.__optional_keys__)
    threads = options.pop("threads", DEFAULT_THREADS)
    # Without ``threads`` (popped above) what is left is create_app's options.
    flask_app = create_app(router, store, auth, **cast("WorkerOptions", options))
    return asgi_app_for(flask_app, threads=threads)


def asgi_app_for(flask_app: flask.Flask, *, threads: int = DEFAULT_THREADS) -> AsgiDeliveries:
    """The ASGI app serving what :func:`create_app` built into ``flask_app``."""
    routes = flask_app.extensions.get(ROUTES_EXTENSION)
    if routes is None:
        raise ConfigurationError(
            f"Flask app {flask_app.name!r} has no tasklease routes: build it with create_app"
        )
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigurationError(f"threads={threads!r}: a positive number of threads")
    fallback: ASGIApp = WsgiBridge(flask_app.wsgi_app, max_body_bytes=routes.max_body_bytes)
    return AsgiDeliveries(routes, fallback, threads=threads)


def app_from_env() -> AsgiDeliveries:
    """The app the environment describes (``TASKLEASE_ROUTER``, ``TASKLEASE_STORE``, ...;
    ``TASKLEASE_ASGI_THREADS`` for ``threads``): ``uvicorn --factory`` calls it."""
    reference = os.environ.get(protocol.ENV_ROUTER)
    if not reference:
        raise ConfigurationError(
            f"set {protocol.ENV_ROUTER}=module:attribute naming your tasklease.Router"
        )
    text = os.environ.get(protocol.ENV_ASGI_THREADS, "").strip() or str(DEFAULT_THREADS)
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ConfigurationError(f"{protocol.ENV_ASGI_THREADS}={text!r}: a number of threads")
    target = load_router(reference)
    if isinstance(target, flask.Flask):
        return asgi_app_for(target, threads=int(text))
    return create_asgi_app(target, threads=int(text))


def __getattr__(name: str) -> AsgiDeliveries:
    # Built on first access (``uvicorn tasklease.worker.asgi:app``), not at import.
    if name == "app":
        built = app_from_env()
        globals()["app"] = built
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AsgiDeliveries", "AsgiOptions", "app_from_env", "asgi_app_for", "create_asgi_app"]
