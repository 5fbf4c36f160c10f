"""A handler that raises a ``BaseException`` that is not an ``Exception``: ``SystemExit``
from code written for a command line (``sys.exit()``, argparse's ``parser.error()``), or a
``KeyboardInterrupt``. It escaped the executor: no answer (gunicorn drops the connection,
uvicorn answers a plain-text 500), no log line, and the run left claimed, so every retry
was answered ``409 in_progress`` until the lease ran out (5 minutes by default), each one
spending an attempt of the queue's retry budget. It is a handler failure like any other:
the run is released and the retry runs at once; an interrupt is raised on after that."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import task_headers


def _router(calls: list[int]) -> Router:
    router = Router()

    @router.task("cli")
    def cli(payload: Any, ctx: TaskContext) -> str:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            sys.exit(2)
        return "done"

    @router.task("acli")
    async def acli(payload: Any, ctx: TaskContext) -> str:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            sys.exit(2)
        return "done"

    @router.task("tcli", transactional=True)
    def tcli(payload: Any, ctx: TaskContext) -> str:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            sys.exit(2)
        return "done"

    @router.task("interrupted")
    def interrupted(payload: Any, ctx: TaskContext) -> str:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            raise KeyboardInterrupt
        return "done"

    return router


@pytest.mark.parametrize("handler", ["cli", "acli", "tcli"])
def test_a_handler_that_calls_sys_exit_is_released_and_its_retry_runs_at_once(
    tmp_path: Path, handler: str
) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    calls: list[int] = []
    client = create_app(_router(calls), store=store, auth="none").test_client()
    try:
        first = client.post(f"/tasks/{handler}", headers=task_headers(), data=b"{}")
        (record,) = store.list_runs()
        retry = client.post(
            f"/tasks/{handler}", headers=task_headers(retry=1, execution=1), data=b"{}"
        )
    finally:
        store.close()
    assert (first.status_code, first.headers["X-Tasklease-Outcome"]) == (500, "released")
    assert record.status is RunStatus.RELEASED
    assert "SystemExit" in (record.error or "")
    assert (retry.status_code, calls) == (200, [1, 2])


def test_an_interrupt_in_a_handler_is_raised_on_after_its_run_is_released(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    client = create_app(_router([]), store=store, auth="none").test_client()
    try:
        with pytest.raises(KeyboardInterrupt):
            client.post("/tasks/interrupted", headers=task_headers(), data=b"{}")
        (record,) = store.list_runs()
    finally:
        store.close()
    assert record.status is RunStatus.RELEASED
