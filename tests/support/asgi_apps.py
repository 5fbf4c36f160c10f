"""Routers and ASGI apps served by uvicorn in tests/worker/test_asgi.py (imported in the child).

Handlers write one line per execution to ``$TEST_DIR/executions.log``; ``hold`` and the
store of :func:`blocking_app` wait until the test creates ``$TEST_DIR/go``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from fastapi import FastAPI

from tasklease.errors import PermanentFailure
from tasklease.worker import Router, TaskContext
from tasklease.worker.asgi import AsgiDeliveries, create_asgi_app
from tasklease.worker.core.records import Claim, ClaimRequest
from tasklease.worker.stores import SqliteStore, store_from_url
from tasklease.worker.stores.base.store import Moment
from tests.support.helpers import SwitchableStore

router = Router()


def _executed(name: str, ctx: TaskContext) -> None:
    line = f"{name} {ctx.run_id} {os.getpid()} {threading.current_thread().name}\n"
    descriptor = os.open(
        os.path.join(os.environ["TEST_DIR"], "executions.log"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    )
    try:
        os.write(descriptor, line.encode())  # One small O_APPEND write: never interleaved.
    finally:
        os.close(descriptor)


def _wait_for_go() -> None:
    deadline = time.monotonic() + 25
    while not os.path.exists(os.path.join(os.environ["TEST_DIR"], "go")):
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        time.sleep(0.02)


@router.task("record")
def record(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    _executed("record", ctx)
    return {"n": payload["n"], "pid": os.getpid()}


@router.task("hold")
def hold(payload: Any, ctx: TaskContext) -> str:
    _executed("hold", ctx)
    _wait_for_go()
    return "held"


@router.task("refuse")
def refuse(payload: Any, ctx: TaskContext) -> None:
    raise PermanentFailure("no such order")


@router.task("flaky")
def flaky(payload: Any, ctx: TaskContext) -> str:
    if ctx.attempt == 1:
        raise ConnectionError("downstream down")
    return "sent"


@router.task("async_record")
async def async_record(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    await asyncio.sleep(0.01)
    ctx.check_lease()
    _executed("async_record", ctx)
    return {"n": payload["n"], "thread": threading.current_thread().name}


@router.task("async_refuse")
async def async_refuse(payload: Any, ctx: TaskContext) -> None:
    raise PermanentFailure("no such order")


@router.scheduled("nightly")
async def nightly(ctx: TaskContext) -> str:
    _executed("nightly", ctx)
    return "ran"


class BlockingStore(SwitchableStore):
    """Every claim waits until the test says go: deliveries block inside the store."""

    def claim(self, request: ClaimRequest, now: Moment) -> Claim:
        with open(os.path.join(os.environ["TEST_DIR"], "claims.log"), "a") as log:
            log.write(f"{request.run_id}\n")
        _wait_for_go()
        return super().claim(request, now)


def blocking_app() -> AsgiDeliveries:
    """The router on a store whose claims block (``uvicorn --factory``)."""
    store = BlockingStore(SqliteStore(os.path.join(os.environ["TEST_DIR"], "runs.db")))
    return create_asgi_app(router, store=store, auth="none")


def fastapi_app() -> FastAPI:
    """A user's FastAPI app with the worker mounted at ``/worker`` (``uvicorn --factory``)."""
    app = FastAPI()

    @app.get("/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    worker = create_asgi_app(
        router,
        store=store_from_url(None),
        dashboard="/tasklease",
        dashboard_operators=["ops@p.iam.gserviceaccount.com"],
    )
    app.mount("/worker", worker)
    return app
