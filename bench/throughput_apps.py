"""The servers bench/worker_throughput.py compares, under one gunicorn configuration.

``bare`` is a plain Flask route doing the handler's work; ``tasklease`` serves the same work
through the exactly-once protocol, on the store ``BENCH_STORE`` names (``memory``; ``sqlite``,
the file in ``BENCH_DB``; ``postgres``, the store URL in ``BENCH_DB``). Authentication is off
in both: the comparison is the protocol's cost, not a token check's.
"""

from __future__ import annotations

import os
from typing import Any

import flask

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores import LeaseStore, MemoryStore, SqliteStore, store_from_url


def work(payload: Any) -> dict[str, Any]:
    """The trivial handler body both servers run."""
    return {"ok": True, "n": len(payload)}


bare = flask.Flask("bare")


@bare.post("/tasks/noop")
def noop() -> Any:
    return work(flask.request.get_json(force=True))


router = Router()


@router.task("noop")
def handler(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    return work(payload)


# The async def twin, at the same path: the like-for-like handler beside an ``async def``
# bare route (bench.asgi_apps).
async_router = Router()


@async_router.task("noop")
async def async_handler(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    return work(payload)


def _store() -> LeaseStore:
    if os.environ.get("BENCH_STORE", "memory") == "memory":
        return MemoryStore()
    if os.environ["BENCH_STORE"] == "postgres":
        return store_from_url(os.environ["BENCH_DB"])
    return SqliteStore(os.environ["BENCH_DB"])


def __getattr__(name: str) -> flask.Flask:
    # Built on first access (by gunicorn), so that importing the module starts nothing.
    if name == "tasklease":
        app = create_app(router, store=_store(), auth="none")
        globals()["tasklease"] = app
        return app
    raise AttributeError(name)
