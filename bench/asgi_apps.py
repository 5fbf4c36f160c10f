"""The servers bench/asgi_throughput.py compares, under one uvicorn configuration.

``bare`` is a plain Starlette route doing the handler's work on the loop (``async def``);
``tasklease`` (a factory) serves the same work through tasklease.worker.asgi on the store
``BENCH_STORE`` names (``memory``; ``sqlite``, the file in ``BENCH_DB``), by the ``async def``
twin of bench.throughput_apps' handler, or by the sync handler itself with
``BENCH_HANDLER=sync``. Authentication is off in both, as in bench.throughput_apps.
"""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bench.throughput_apps import async_router, router, work
from tasklease.worker.asgi import AsgiDeliveries, create_asgi_app
from tasklease.worker.stores import LeaseStore, MemoryStore, SqliteStore


async def noop(request: Request) -> JSONResponse:
    return JSONResponse(work(await request.json()))


def bare() -> Starlette:
    """The bare route's app (``--factory``, as the worker's is)."""
    return Starlette(routes=[Route("/tasks/noop", noop, methods=["POST"])])


def _store() -> LeaseStore:
    if os.environ.get("BENCH_STORE", "memory") == "memory":
        return MemoryStore()
    return SqliteStore(os.environ["BENCH_DB"])


def tasklease() -> AsgiDeliveries:
    """The worker on the store and handler the environment names (``uvicorn --factory``)."""
    handlers = router if os.environ.get("BENCH_HANDLER") == "sync" else async_router
    return create_asgi_app(handlers, store=_store(), auth="none")
