"""The floor under PostgresStore: CPU that PostgreSQL itself spends per durable execution.

One execution is the store's two statements for a first execution, tasklease's own: the
claim (the insert-or-read statement) and the finish (the ``UPDATE`` conditional on the
version), each an autocommit transaction, from ``clients`` connections at once (a worker's
threads), on a private cluster with fsync on. Prints the server's CPU (every process of the
cluster, from /proc) and wall time per execution.

With ``--batch N`` (N > 1) each client sends its claims N at a time, then their finishes N at
a time, each N in one pipeline with one Sync (one transaction, one commit), as the store's
group commit sends the statements of N concurrent requests of one process: ``--clients 2
--batch 8`` is two gunicorn workers' batches of eight threads.

    python -m bench.postgres_floor [--executions 4000] [--clients 1 4 8] [--batch 1 4 8]

Set against ``cpu us/req`` of bench.worker_throughput's bare route, this bounds the ratio a
Postgres first execution can reach when Postgres shares the machine's cores:
``bare / (bare + floor)``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench.common import ROOT
from tasklease.worker.core import decisions
from tasklease.worker.core.records import ClaimRequest
from tasklease.worker.stores.postgres.schema import (
    Statements,
    encode_run,
    encode_run_changes,
    migrate,
)

sys.path.insert(0, str(ROOT))
from tests.support.postgres import Cluster, running_cluster


@contextmanager
def private_postgres() -> Iterator[Cluster]:
    """A private, durable cluster (fsync on) for the benchmark's lifetime."""
    with running_cluster(durable=True) as cluster:
        yield cluster


def cluster_cpu_seconds(cluster: Cluster) -> float:
    """CPU (user + system) the cluster has used so far: the postmaster's own, its live
    children's, and that of the children it has reaped (backends of closed connections)."""
    postmaster, *children = cluster.processes()
    total = sum(_stat(postmaster)[11:15])  # utime, stime, cutime, cstime (fields 14-17).
    for pid in children:
        total += sum(_stat(pid)[11:13])
    return total / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[int]:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return [0] * 15
    return [int(field) if field.lstrip("-").isdigit() else 0 for field in fields[:15]]


def execute(url: str, statements: Statements, count: int, batch: int = 1) -> None:
    """``count`` first executions (claims, then finishes) on one connection, ``batch`` at a
    time."""
    now = datetime.now(UTC)
    with psycopg.connect(url, autocommit=True) as connection:
        for _ in range(count // batch):
            claims, finishes = [], []
            for _ in range(batch):
                request = ClaimRequest(
                    run_id=uuid.uuid4().hex, kind="task", handler="noop",
                    attempt_id=uuid.uuid4().hex, lease=timedelta(minutes=5),
                    retention=timedelta(days=7),
                    identity={"queue": "bench", "task_name": uuid.uuid4().hex},
                )  # fmt: skip
                claimed = decisions.claim(None, request, now).record
                claims.append([*encode_run(claimed), claimed.run_id])
                done = decisions.kept(decisions.completed(claimed, '{"ok":true}', now), now, None)
                columns, values = encode_run_changes(claimed, done)  # What the store sends.
                finishes.append([*values, done.run_id, 1, done.attempt_id])
            rows = _send(connection, [(statements.claim, params) for params in claims])
            assert all(row is not None and row[0] for row in rows)
            update = statements.update_columns(columns)
            rows = _send(connection, [(update, params) for params in finishes])
            assert all(row is not None for row in rows)


def _send(connection: psycopg.Connection[Any], batch: list[tuple[str, list[Any]]]) -> list[Any]:
    """One statement alone (autocommit), or several in one pipeline and one Sync."""
    if len(batch) == 1:
        return [connection.execute(*batch[0]).fetchone()]
    with connection.pipeline():  # Its exit sends the one Sync and reads the results.
        cursors = [connection.execute(statement, params) for statement, params in batch]
    return [cursor.fetchone() for cursor in cursors]


def measure(cluster: Cluster, clients: int, executions: int, batch: int = 1) -> tuple[float, float]:
    schema = f"floor_{uuid.uuid4().hex[:8]}"
    url = cluster.url()
    with psycopg.connect(url, autocommit=True) as connection:
        migrate(connection, schema)
    statements = Statements(schema)
    each = executions // clients // batch * batch
    threads = [
        threading.Thread(target=execute, args=(url, statements, each, batch))
        for _ in range(clients)
    ]
    started, used = time.perf_counter(), cluster_cpu_seconds(cluster)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    cpu = cluster_cpu_seconds(cluster) - used
    done = each * clients
    return cpu / done * 1e6, wall / done * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=4000)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--batch", type=int, nargs="+", default=[1], help="statements per commit")
    args = parser.parse_args()
    with private_postgres() as cluster:
        print(f"PostgreSQL alone, per execution (claim + finish), {args.executions} each")
        print(f"  {'clients':<9}{'batch':>6}{'server cpu us':>14}{'wall us':>9}")
        for batch in args.batch:
            for clients in args.clients:
                cpu, wall = measure(cluster, clients, args.executions, batch)
                print(f"  {clients:<9}{batch:>6}{cpu:>14.0f}{wall:>9.0f}")


if __name__ == "__main__":
    main()
