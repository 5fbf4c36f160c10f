"""Throughput of tasklease.worker.asgi against a bare Starlette route, under real uvicorn.

The ASGI twin of bench/worker_throughput.py, with its load generator (wrk, else a slower
Python stand-in), its rounds and its table: one uvicorn configuration (the deploy kit's,
tasklease.worker.asgi_serve: 2 worker processes, access log off) serving a bare Starlette
route doing a trivial handler's work, then tasklease serving the same work on MemoryStore and
on SqliteStore (synchronous=FULL), first executions (a new task name per request) and
duplicates (one repeated name marked as a retry). The bare route is an ``async def``: the
like-for-like tasklease handler is its ``async def`` twin (the rows named ``async``); the
rows named ``sync`` serve bench.throughput_apps' sync handler (a delivery thread's work).
Quote the ratios of one round.

    python -m bench.asgi_throughput [--rounds 2] [--seconds 8] [--stores memory,sqlite]
        [--handlers async,sync]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import BENCH_DIR, ROOT, free_port, wait_for_port
from bench.worker_throughput import Load, Server, post, print_round, run_python, run_wrk


class UvicornServer(Server):
    """One uvicorn server of bench.asgi_apps, started and fully stopped."""

    def __init__(self, app: str, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable, "-m", "tasklease.worker.asgi_serve", f"bench.asgi_apps:{app}",
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "2",
            "--no-access-log", "--log-level", "warning",
        ]  # fmt: skip
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as output:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env={**os.environ, **env}, stdout=output, stderr=output
            )
        wait_for_port(self.port)
        for index in range(20):  # Every worker imported the app and answers.
            post(self.port, f"warm-{uuid.uuid4().hex}-{index}", retry=0)
        time.sleep(1.0)


def measure_round(
    seconds: int, log: Path, stores: list[str], handlers: list[str]
) -> dict[str, Load]:
    drive = run_wrk if shutil.which("wrk") else run_python
    results: dict[str, Load] = {}
    server = UvicornServer("bare", {}, log)
    try:
        results["bare starlette"] = server.measure(drive, "first.lua", seconds)
    finally:
        server.stop()
    for store in stores:
        for handler in handlers:
            with tempfile.TemporaryDirectory() as folder:
                env = {
                    "BENCH_STORE": store,
                    "BENCH_DB": str(Path(folder) / "runs.db"),
                    "BENCH_HANDLER": handler,
                }
                server = UvicornServer("tasklease", env, log)
                name = f"{store} {handler}"
                try:
                    results[f"{name} first"] = server.measure(drive, "first.lua", seconds)
                    for _ in range(4):  # Complete the repeated task in both workers' stores.
                        post(server.port, "same-task", retry=0)
                    results[f"{name} dup"] = server.measure(drive, "duplicate.lua", seconds)
                finally:
                    server.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--stores", default="memory,sqlite", help="of memory, sqlite")
    parser.add_argument("--handlers", default="async,sync", help="of async, sync")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print(
            "warning: wrk not found (apt-get install wrk, or make bench); using the Python "
            "load generator, which is slower than the servers: ratios understate differences",
            file=sys.stderr,
        )
    log = BENCH_DIR / "asgi_throughput.log"
    print("uvicorn 2 workers; wrk 2 threads, 16 connections; trivial handler")
    for round_ in range(1, args.rounds + 1):
        results = measure_round(args.seconds, log, args.stores.split(","), args.handlers.split(","))
        # print_round divides by its first entry, keyed "bare".
        print_round(round_, {"bare": results.pop("bare starlette"), **results})


if __name__ == "__main__":
    main()
