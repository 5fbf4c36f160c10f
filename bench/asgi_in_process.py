"""CPU per request of the ASGI apps of bench/asgi_throughput.py, in process: no sockets.

Sixteen concurrent requests at a time through ``bench.asgi_apps``' bare Starlette route and
tasklease on MemoryStore (first executions, then duplicates; ``first`` and ``duplicate`` by the
``async def`` handler, ``sync-first`` and ``sync-duplicate`` by the sync one), on one event
loop. It measures the apps' own cost without uvicorn's, in the reference configuration
(MemoryStore, authentication off: no deployment's; bench/asgi_throughput.py measures those).
tasklease's log lines go to stderr: send them to a file, as the servers' are. Under ``valgrind
--tool=callgrind`` at two ``--requests`` counts, the difference in instructions over the
difference in requests (x 1.1: the warm-up grows with them too) is a figure a loaded machine
does not move.

    python -m bench.asgi_in_process [--requests 16000] [--apps bare,first,duplicate] 2>log
        (apps: bare, first, duplicate, sync-first, sync-duplicate)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections import Counter
from typing import Any

from bench.asgi_apps import bare, tasklease
from tasklease.worker.serving.asgi_routes import ASGIApp

BODY = b'{"order_id": 42}'
CONCURRENCY = 16


def scope(task: str, retry: int) -> dict[str, Any]:
    headers = {
        "host": "127.0.0.1:8000",
        "content-type": "application/json",
        "x-cloudtasks-queuename": "bench",
        "x-cloudtasks-taskname": task,
        "x-cloudtasks-taskretrycount": str(retry),
        "x-cloudtasks-taskexecutioncount": str(retry),
        "x-cloudtasks-tasketa": "1792152000.5",
        "content-length": str(len(BODY)),
    }
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/tasks/noop",
        "raw_path": b"/tasks/noop",
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
    }


async def request(app: ASGIApp, task: str, retry: int, statuses: Counter[int]) -> None:
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if received:
            await asyncio.sleep(3600)  # The client never goes away.
        received = True
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            statuses[message["status"]] += 1

    await app(scope(task, retry), receive, send)


async def measure(app: ASGIApp, duplicates: bool, requests: int) -> tuple[float, Counter[int]]:
    """CPU seconds per request of ``requests`` requests (after a warm-up), and the statuses."""
    nonce = uuid.uuid4().hex[:8]
    statuses: Counter[int] = Counter()
    if duplicates:
        await request(app, "same-task", 0, statuses)

    async def client(number: int, count: int, phase: str) -> None:
        for index in range(count):
            if duplicates:
                await request(app, "same-task", 1, statuses)
            else:
                await request(app, f"t-{nonce}-{phase}-{number}-{index}", 0, statuses)

    warm = max(requests // CONCURRENCY // 10, 1)  # Both the first and the timed counts grow.
    await asyncio.gather(*(client(n, warm, "warm") for n in range(CONCURRENCY)))
    statuses.clear()
    started = time.process_time()
    each = requests // CONCURRENCY
    await asyncio.gather(*(client(n, each, "timed") for n in range(CONCURRENCY)))
    return (time.process_time() - started) / (each * CONCURRENCY), statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16000)
    parser.add_argument("--apps", default="bare,first,duplicate")
    args = parser.parse_args()
    for name in args.apps.split(","):
        os.environ["BENCH_HANDLER"] = "sync" if name.startswith("sync-") else "async"
        app: ASGIApp = bare() if name == "bare" else tasklease()
        duplicates = name.endswith("duplicate")
        seconds, statuses = asyncio.run(measure(app, duplicates, args.requests))
        print(f"  {name:<10} {seconds * 1e6:8.1f} us CPU per request  {dict(statuses)}")


if __name__ == "__main__":
    main()
