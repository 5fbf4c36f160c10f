"""The floor under SqliteStore: CPU that SQLite itself spends per durable execution.

One execution is the store's two changes: the claim (read the run, insert it) and the finish
(read it, update it in place), with tasklease's schema and statements and no framework at
all. Changes are grouped ``batch`` executions to a transaction, as group commit does at best
(a gunicorn worker with 4 threads can group at most 4 requests' changes). Prints CPU (user
and system, from getrusage) and wall time per execution.

    python -m bench.sqlite_floor [--executions 4000]

Set against ``cpu us/req`` of bench.worker_throughput's bare route, this bounds the ratio a
SQLite first execution can reach on the same machine however lean the rest becomes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

# The store's own schema and statements, so the floor is the store's (private on purpose:
# a benchmark of internals).
from tasklease.worker.stores.sqlite.schema import INSERT, SCHEMA, SELECT_ONE, UPDATE

_FINISH_AT = 10**15 + 10**11


def run_row(number: int) -> tuple[Any, ...]:
    """A run record as SqliteStore encodes a first execution's claim."""
    run_id = hashlib.sha256(str(number).encode()).hexdigest()[:32]
    identity = {"handler": "noop", "kind": "task", "queue": "bench", "task_name": f"t-{number}"}
    now = 10**15 + number
    return (
        run_id, "task", "noop", "running", "a" * 32, 1, 1, now + 10**7, now + 10**9, now, None,
        json.dumps(identity, sort_keys=True), None, None, '{"order_id": 42}', None, None, None,
    )  # fmt: skip


def finished(row: tuple[Any, ...]) -> list[Any]:
    """The UPDATE's parameters that finish ``row``'s run (state columns, then the run id)."""
    state = [
        "succeeded", row[4], row[5], row[6], row[7], _FINISH_AT, row[9], _FINISH_AT,
        '{"ok":true}', None, row[14], None, None, None,
    ]  # fmt: skip
    return [*state, row[0]]


def measure(synchronous: str, batch: int, executions: int) -> tuple[float, float]:
    """CPU and wall microseconds per execution: each transaction claims ``batch`` new runs
    and finishes the previous transaction's ``batch``."""
    with tempfile.TemporaryDirectory() as folder:
        connection = sqlite3.connect(Path(folder) / "runs.db", isolation_level=None)
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute(f"PRAGMA synchronous = {synchronous}")
        for statement in filter(str.strip, SCHEMA.split(";")):
            connection.execute(statement)
        started, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        previous: list[tuple[Any, ...]] = []
        for first in range(0, executions, batch):
            rows = [run_row(number) for number in range(first, first + batch)]
            connection.execute("BEGIN IMMEDIATE")
            for row in rows:
                connection.execute(SELECT_ONE, (row[0],)).fetchone()
                connection.execute(INSERT, row)
            for row in previous:
                connection.execute(SELECT_ONE, (row[0],)).fetchone()
                connection.execute(UPDATE, finished(row))
            connection.execute("COMMIT")
            previous = rows
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        connection.close()
    cpu = after.ru_utime - used.ru_utime + after.ru_stime - used.ru_stime
    return cpu / executions * 1e6, wall / executions * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=4000)
    args = parser.parse_args()
    print(f"SQLite alone, per execution (claim + finish), {args.executions} executions each")
    print(f"  {'synchronous':<13}{'batch':>6}{'cpu us':>9}{'wall us':>9}")
    for synchronous in ("FULL", "NORMAL"):
        for batch in (1, 4, 8):
            cpu, wall = measure(synchronous, batch, args.executions)
            print(f"  {synchronous:<13}{batch:>6}{cpu:>9.0f}{wall:>9.0f}")


if __name__ == "__main__":
    main()
