"""Where a worker's CPU per PostgresStore first execution goes, in one process.

First executions (a new task name each) go through Flask's test client, on a private
cluster (fsync on): the bare route, the same handler on MemoryStore, and on PostgresStore.
Prints this process's CPU per delivery (user, system) and its voluntary context switches
(each a wait for the server), so that the store's share is set apart from the framework's.

    python -m bench.postgres_worker_cpu [--deliveries 3000]

CPU time on a shared machine varies with the load; instruction counts do not. Run the
PostgresStore part alone under callgrind twice, and divide the difference by the count:

    valgrind --tool=callgrind python -m bench.postgres_worker_cpu --only postgres --deliveries 0
    valgrind --tool=callgrind python -m bench.postgres_worker_cpu --only postgres --deliveries 300
"""

from __future__ import annotations

import argparse
import os
import resource
import uuid
from typing import Any
from urllib.parse import quote

from bench.postgres_floor import private_postgres

HEADERS = {
    "X-CloudTasks-QueueName": "bench",
    "X-CloudTasks-TaskRetryCount": "0",
    "X-CloudTasks-TaskExecutionCount": "0",
    "X-CloudTasks-TaskETA": "1792152000.5",
}
WARM_UP = 50


def deliver(app: Any, count: int) -> None:
    """``count`` first executions of ``app``'s ``noop`` task."""
    client = app.test_client()
    for _ in range(count):
        headers = {**HEADERS, "X-CloudTasks-TaskName": uuid.uuid4().hex}
        response = client.post("/tasks/noop", headers=headers, data=b'{"order_id": 42}')
        if response.status_code != 200:
            raise RuntimeError(response.get_data(as_text=True))


def measure(app: Any, count: int) -> tuple[float, float, float]:
    """User and system CPU (us) and voluntary context switches, per delivery."""
    deliver(app, WARM_UP)
    before = resource.getrusage(resource.RUSAGE_SELF)
    deliver(app, count)
    after = resource.getrusage(resource.RUSAGE_SELF)
    n = max(count, 1)
    return (
        (after.ru_utime - before.ru_utime) / n * 1e6,
        (after.ru_stime - before.ru_stime) / n * 1e6,
        (after.ru_nvcsw - before.ru_nvcsw) / n,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deliveries", type=int, default=3000)
    parser.add_argument("--only", choices=["postgres"], help="PostgresStore alone (callgrind)")
    parser.add_argument("--unix", action="store_true", help="the cluster's Unix socket, not TCP")
    args = parser.parse_args()
    with private_postgres() as cluster:
        schema = f"cpu_{uuid.uuid4().hex[:8]}"
        url = cluster.url()
        if args.unix:  # libpq reads a host that is a directory as its socket's.
            socket_dir = quote(str(cluster.sockets), safe="")
            url = f"postgresql://postgres@{socket_dir}:{cluster.port}/postgres"
        os.environ.update(BENCH_STORE="postgres", BENCH_DB=f"{url}?schema={schema}&max_size=4")
        from bench import throughput_apps  # noqa: PLC0415 - reads BENCH_STORE when built.
        from tasklease.worker import create_app  # noqa: PLC0415
        from tasklease.worker.stores import MemoryStore  # noqa: PLC0415

        apps: list[tuple[str, Any]] = [("PostgresStore", throughput_apps.tasklease)]
        if args.only is None:
            memory = create_app(throughput_apps.router, store=MemoryStore(), auth="none")
            apps = [("bare route", throughput_apps.bare), ("MemoryStore", memory), *apps]
        rows = [(label, *measure(app, args.deliveries)) for label, app in apps]
        throughput_apps.tasklease.extensions["tasklease"].store.close()  # Before the cluster.
    print(f"worker CPU per first execution, {args.deliveries} through the test client")
    print(f"  {'':16} {'user us':>8} {'sys us':>8} {'waits':>6}")
    for label, user, system, waits in rows:
        print(f"  {label:16} {user:8.0f} {system:8.0f} {waits:6.1f}")


if __name__ == "__main__":
    main()
