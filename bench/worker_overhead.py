"""Worker overhead per delivery: the claim/finish path against a bare Flask handler.

Deliveries go through Flask's test client in this process (no network), so the numbers are
the cost tasklease adds: header parsing, the atomic claim, the lease keeper, the finish and
the log line. First executions use a new task name each; duplicates repeat one.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flask

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.observe.logs import CloudLoggingFormatter
from tasklease.worker.stores import MemoryStore, SqliteStore

HEADERS = {
    "X-CloudTasks-QueueName": "bench",
    "X-CloudTasks-TaskRetryCount": "0",
    "X-CloudTasks-TaskExecutionCount": "0",
    "X-CloudTasks-TaskETA": "1792152000.5",
}
BODY = b'{"order_id": 42}'


def rate(app: flask.Flask, count: int, name_of: Callable[[int], str]) -> float:
    client = app.test_client()
    started = time.perf_counter()
    for n in range(count):
        response = client.post(
            "/tasks/noop", headers={**HEADERS, "X-CloudTasks-TaskName": name_of(n)}, data=BODY
        )
        if response.status_code != 200:
            raise RuntimeError(response.get_data(as_text=True))
    return count / (time.perf_counter() - started)


def bare_app() -> flask.Flask:
    app = flask.Flask("bare")

    @app.post("/tasks/noop")
    def noop() -> Any:
        flask.request.get_json(force=True)
        return {"ok": True}

    return app


def tasklease_app(store: Any) -> flask.Flask:
    router = Router()

    @router.task("noop")
    def noop(payload: Any, ctx: TaskContext) -> None:
        return None

    return create_app(router, store=store, auth="none")


def async_app(store: Any) -> flask.Flask:
    """The same, with an ``async def`` handler: the hand-off to the handler loop and back."""
    router = Router()

    @router.task("noop")
    async def noop(payload: Any, ctx: TaskContext) -> None:
        return None

    return create_app(router, store=store, auth="none")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deliveries", type=int, default=3000)
    args = parser.parse_args()
    # Keep the JSON log lines (their formatting is part of the cost), but send them nowhere.
    sink = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 - lives as long as main.
    sink.setFormatter(CloudLoggingFormatter())
    logging.getLogger("tasklease").addHandler(sink)
    logging.getLogger("tasklease").setLevel(logging.INFO)
    logging.getLogger("tasklease").propagate = False
    n = args.deliveries
    with tempfile.TemporaryDirectory() as tmp:
        bare = rate(bare_app(), n, str)
        rows = [("bare Flask handler", bare, bare)]
        for label, make, store in [
            ("tasklease, MemoryStore", tasklease_app, MemoryStore()),
            ("async def, MemoryStore", async_app, MemoryStore()),
            ("tasklease, SqliteStore", tasklease_app, SqliteStore(Path(tmp) / "runs.db")),
        ]:
            app = make(store)
            first = rate(app, n, lambda i: f"task-{i}")
            duplicate = rate(app, n, lambda i: "task-0")
            rows.append((label, first, duplicate))
    print(f"worker: {n} deliveries through Flask's test client, in one process")
    print(f"  {'':24} {'first execution':>22} {'duplicate':>22}")
    for label, first, duplicate in rows:
        print(
            f"  {label:24} {first:9.0f}/s {1e6 / first:7.0f} us "
            f"{duplicate:9.0f}/s {1e6 / duplicate:7.0f} us"
        )
    for label, first, duplicate in rows[1:]:
        print(
            f"  {label}: {1e6 / first - 1e6 / bare:5.0f} us added per first execution, "
            f"{1e6 / duplicate - 1e6 / bare:5.0f} us per duplicate "
            f"(bare / tasklease: {bare / first:4.2f}x, {bare / duplicate:4.2f}x)"
        )


if __name__ == "__main__":
    main()
