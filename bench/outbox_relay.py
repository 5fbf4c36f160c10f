"""The outbox: commit -> task created (fast path), relay throughput, cost per enqueue.

- latency: one order transaction at a time enqueues its task with ``transaction=conn`` and
  commits; a following relay in the process (Postgres: woken by LISTEN/NOTIFY) creates it in
  the local emulator; measured from the commit's return to the relay's ``sent_at`` (written
  right after Cloud Tasks answered). p50/p99.
- throughput: 10,000 committed entries waiting; one relay drains them (batches of 100 per
  BatchCreateTasks) into the emulator: tasks/s.
- cost: the caller's transaction (insert an order, commit) with and without the enqueue
  (one more insert, plus the NOTIFY on Postgres): microseconds per transaction.

    python -m bench.outbox_relay [--latency 300] [--entries 10000] [--cost 2000]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.common import ROOT
from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import Relay, RelayThread, open_outbox, relay_producer

sys.path.insert(0, str(ROOT))
from tests.outbox_support import QUEUE_PATH, producer, sqlite_app_db
from tests.postgres_support import running_cluster


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def pg_setup(base: str, schema: str) -> tuple[str, Callable[[], Any]]:
    url = f"{base}?schema={schema}"
    db = open_outbox(url)
    db.migrate()
    db.close()
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE TABLE {schema}.orders (id TEXT PRIMARY KEY)")
    return url, lambda: psycopg.connect(base, options=f"-c search_path={schema}")


def sqlite_setup(path: Path) -> tuple[str, Callable[[], Any]]:
    url = sqlite_app_db(path)
    return url, lambda: sqlite3.connect(path, timeout=30)


def mark(conn: Any) -> str:
    return "?" if isinstance(conn, sqlite3.Connection) else "%s"


def latency(name: str, url: str, connect: Callable[[], Any], emulator: Any, n: int) -> None:
    env = {"TASKLEASE_TASKS_ENDPOINT": emulator.url}
    make = producer(emulator.url)
    conn = connect()
    samples: list[float] = []
    reader = open_outbox(url)
    with RelayThread(url, relay_producer(env), poll=0.005):
        for i in range(n):
            conn.cursor().execute(f"INSERT INTO orders VALUES ({mark(conn)})", (f"lat-{i}",))
            result = make.enqueue("record", {"i": i}, key=f"lat-{i}", transaction=conn)
            conn.commit()
            committed = time.time()
            while True:
                sent = _sent_at(reader, result.name)
                if sent is not None:
                    samples.append(sent - committed)
                    break
                time.sleep(0.0005)
    reader.close()
    conn.close()
    ms = [s * 1000 for s in samples]
    print(
        f"{name:9} commit->task created ({'LISTEN/NOTIFY' if 'postgres' in name else 'poll 5 ms'})"
        f": n={n} p50={pct(ms, 50):.1f} ms p99={pct(ms, 99):.1f} ms max={max(ms):.1f} ms"
    )


def _sent_at(db: Any, entry_id: str) -> float | None:
    with db._transaction() as cursor:
        cursor.execute(f"SELECT sent_at FROM tasklease_outbox WHERE id = {db._mark()}", (entry_id,))
        row = cursor.fetchone()
    return None if row is None or row[0] is None else float(row[0])


def throughput(name: str, url: str, connect: Callable[[], Any], emulator: Any, n: int) -> None:
    make = producer(emulator.url)
    conn = connect()
    if isinstance(conn, sqlite3.Connection):
        conn.execute("BEGIN")
    make.enqueue_many("record", [(f"tp-{i}", {"i": i}) for i in range(n)], transaction=conn)
    conn.commit()
    conn.close()
    db = open_outbox(url)
    relay = Relay(db, relay_producer({"TASKLEASE_TASKS_ENDPOINT": emulator.url}))
    started = time.perf_counter()
    done = relay.drain()
    elapsed = time.perf_counter() - started
    db.close()
    assert done.sent == n, done
    rate = n / elapsed
    print(f"{name:9} relay throughput: {n} waiting entries in {elapsed:.2f} s = {rate:,.0f}/s")


def cost(name: str, connect: Callable[[], Any], n: int) -> None:
    make = producer("http://127.0.0.1:9")
    conn = connect()

    def run(prefix: str, enqueue: bool) -> float:
        started = time.perf_counter()
        for i in range(n):
            if isinstance(conn, sqlite3.Connection):
                conn.execute("BEGIN")
            conn.cursor().execute(f"INSERT INTO orders VALUES ({mark(conn)})", (f"{prefix}{i}",))
            if enqueue:
                make.enqueue("record", {"i": i}, key=f"{prefix}{i}", transaction=conn)
            conn.commit()
        return (time.perf_counter() - started) / n * 1e6

    run("warm-", True)
    bare = statistics.median([run(f"b{r}-", False) for r in range(3)])
    outbox = statistics.median([run(f"o{r}-", True) for r in range(3)])
    conn.close()
    print(
        f"{name:9} caller's transaction: {bare:.0f} us bare, {outbox:.0f} us with the enqueue "
        f"(+{outbox - bare:.0f} us, x{outbox / bare:.2f}); the enqueue is one insert"
        f"{' + NOTIFY' if 'postgres' in name else ''}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", type=int, default=300)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--cost", type=int, default=2000)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_cluster(durable=True) as cluster,
        CloudTasksEmulator(scheduler_on_schedule=False, grpc_port=0) as emulator,
    ):
        emulator.create_queue(QUEUE_PATH, state="PAUSED")  # Count creates, dispatch none.
        base = cluster.url()

        def postgres(tag: str) -> tuple[str, Callable[[], Any]]:
            return pg_setup(base, f"bench_{tag}")

        def sqlite(tag: str) -> tuple[str, Callable[[], Any]]:
            return sqlite_setup(Path(tmp) / f"{tag}.db")

        setups = {"postgres": postgres, "sqlite": sqlite}
        for name, setup in setups.items():
            url, connect = setup("lat")
            latency(name, url, connect, emulator, args.latency)
            url, connect = setup("tp")
            throughput(name, url, connect, emulator, args.entries)
            _, connect = setup("cost")
            cost(name, connect, args.cost)


if __name__ == "__main__":
    main()
