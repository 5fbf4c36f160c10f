"""Finding: the execution line written straight to tasklease's own handler skips logging's
error handling, so a failing log stream (a closed pipe, a full disk) turns a processed run's
200 into a 500: Cloud Tasks retries a run that completed, and every retry fails the same way."""

from __future__ import annotations

import errno
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.observe import logs
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.memory.store import MemoryStore
from tests.support.helpers import FakeClock, task_headers


class FullDisk:
    """A stderr whose writes fail, as a redirect to a full disk or a closed pipe does."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        pass


@pytest.fixture
def failing_stderr(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    logger = logging.getLogger("tasklease")
    root = logging.getLogger()
    saved = (list(logger.handlers), logger.propagate, logger.level, list(root.handlers))
    logger.handlers.clear()
    root.handlers.clear()
    monkeypatch.setattr(sys, "stderr", FullDisk())
    monkeypatch.delenv("TASKLEASE_LOG_FORMAT", raising=False)
    logs.configure_logging()  # tasklease's own JSON handler: the direct path is taken.
    yield
    logger.handlers[:], logger.propagate, root.handlers[:] = saved[0], saved[1], saved[3]
    logger.setLevel(saved[2])
    monkeypatch.setattr(logs, "_own_json_handler", None)


def test_a_failing_log_stream_does_not_turn_a_processed_run_into_an_error(
    failing_stderr: None, clock: FakeClock
) -> None:
    router = Router()
    calls: list[Any] = []

    @router.task("ship")
    def ship(payload: Any, ctx: TaskContext) -> str:
        calls.append(payload)
        return "shipped"

    store = MemoryStore()
    own = logs._own_json_handler
    assert own is not None
    logging.getLogger("tasklease").handlers[:] = [own]  # Drop pytest's capture handlers.
    app = create_app(router, store=store, auth="none", clock=clock)
    client = app.test_client()
    status: int | str
    try:
        reply = client.post("/tasks/ship", headers=task_headers(), data=json.dumps({"n": 1}))
        status = reply.status_code
    except OSError as exc:  # Escaped the app: the WSGI server answers 500 (or drops it).
        status = f"raised {exc!r}"
    assert calls == [{"n": 1}]
    assert status == 200
