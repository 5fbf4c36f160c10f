"""Durable steps: the cost per step against a handler without steps.

Deliveries go through Flask's test client in this process (no network), on a SQLite file
and on the memory store. Each handler does ``--steps`` trivial steps; "first" runs them
(one fenced store write each), "replay" is a retry after the last step (every step answered
from the record the claim returned: no store call). The baseline runs the same trivial
functions without ``ctx.step``, with the same claim, release, retry and completion.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
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
}


def build(store: Any, steps: int, *, durable: bool, crash: set[str]) -> flask.Flask:
    router = Router()

    @router.task("h")
    def handler(payload: Any, ctx: TaskContext) -> int:
        total = 0
        for i in range(steps):
            if durable:
                total += ctx.step(f"item-{i}", lambda i=i: i)
            else:
                total += i
        if ctx.task_name in crash:  # The first delivery of a "replay" run fails after its steps.
            crash.discard(ctx.task_name)
            raise RuntimeError("fail after the steps")
        return total

    return create_app(router, store=store, auth="none")


def seconds_per_delivery(app: flask.Flask, names: list[str], retry: bool = False) -> float:
    client = app.test_client()
    started = time.perf_counter()
    for name in names:
        headers = {**HEADERS, "X-CloudTasks-TaskName": name}
        if retry:
            headers["X-CloudTasks-TaskRetryCount"] = "1"
        client.post("/tasks/h", headers=headers, data=b"{}")
    return (time.perf_counter() - started) / len(names)


def measure(store_of: Any, runs: int, steps: int) -> dict[str, float]:
    """Seconds per delivery. Every run's first delivery fails after its steps (released),
    its retry completes: the same store calls with and without steps, but the steps'."""
    timings = {}
    for durable in (False, True):
        names = [f"r-{n}" for n in range(runs)]
        app = build(store_of(), steps, durable=durable, crash=set(names))
        first = seconds_per_delivery(app, names)
        retry = seconds_per_delivery(app, names, retry=True)
        label = "steps" if durable else "plain"
        timings.update({f"{label}_first": first, f"{label}_retry": retry})
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    sink = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 - lives as long as main.
    sink.setFormatter(CloudLoggingFormatter())
    logging.getLogger("tasklease").addHandler(sink)
    logging.getLogger("tasklease").setLevel(logging.INFO)
    logging.getLogger("tasklease").propagate = False
    with tempfile.TemporaryDirectory() as tmp:
        counter = iter(range(10**6))
        stores = {
            "memory": MemoryStore,
            "sqlite": lambda: SqliteStore(Path(tmp) / f"runs-{next(counter)}.db"),
        }
        for name, store_of in stores.items():
            m = measure(store_of, args.runs, args.steps)
            run = (m["steps_first"] - m["plain_first"]) / args.steps
            replayed = (m["steps_retry"] - m["plain_retry"]) / args.steps
            print(
                f"{name}: {args.steps} steps/run, {args.runs} runs. Delivery that runs the "
                f"steps: {m['plain_first'] * 1e3:.3f} ms without steps, "
                f"{m['steps_first'] * 1e3:.3f} ms with "
                f"({m['steps_first'] / m['plain_first']:.2f}x), "
                f"{run * 1e6:.1f} us per step run. Retry that replays them: "
                f"{m['plain_retry'] * 1e3:.3f} ms without, {m['steps_retry'] * 1e3:.3f} ms with "
                f"({m['steps_retry'] / m['plain_retry']:.2f}x), {replayed * 1e6:.1f} us per step "
                "replayed"
            )


if __name__ == "__main__":
    main()
