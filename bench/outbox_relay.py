"""The outbox: commit -> task created (fast path), relay throughput, cost per enqueue.

- latency: one order transaction at a time enqueues its task with ``transaction=conn`` and
  commits; a following relay in the process (Postgres: woken by LISTEN/NOTIFY; Firestore: by
  its listener; Spanner: by the commit's return in the process; SQLite: a 5 ms poll) creates
  it in the local emulator; measured from the commit's return to the relay's ``sent_at``
  (written right after Cloud Tasks answered). p50/p99.
- throughput: 10,000 committed entries waiting; one relay drains them (batches of 100 per
  BatchCreateTasks) into the emulator: tasks/s.
- cost: the caller's transaction (insert an order, commit) with and without the enqueue
  (one more insert, plus the NOTIFY on Postgres): microseconds per transaction.

Firestore and Spanner run on Google's emulators (gcloud), started here.

    python -m bench.outbox_relay [--latency 300] [--entries 10000] [--cost 2000]
        [--stores postgres,sqlite,firestore,spanner]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from bench.common import ROOT
from bench.outbox_callers import Caller, FirestoreCaller, SpannerCaller, SqlCaller
from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import Relay, RelayThread, open_outbox, relay_producer

sys.path.insert(0, str(ROOT))
from tests.support.firestore import run_gcloud_emulator
from tests.support.outbox import QUEUE_PATH, producer, sqlite_app_db
from tests.support.postgres import running_cluster
from tests.support.spanner import create_database, run_emulator


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def pg_caller(base: str, schema: str) -> Caller:
    url = f"{base}?schema={schema}"
    db = open_outbox(url)
    db.migrate()
    db.close()
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE TABLE {schema}.orders (id TEXT PRIMARY KEY)")
    connect = partial(psycopg.connect, base, options=f"-c search_path={schema}")
    return SqlCaller(url, connect, "LISTEN/NOTIFY")


def sqlite_caller(path: Path) -> Caller:
    url = sqlite_app_db(path)
    return SqlCaller(url, partial(sqlite3.connect, path, timeout=30), "poll 5 ms")


def latency(name: str, caller: Caller, emulator: Any, n: int) -> None:
    env = {"TASKLEASE_TASKS_ENDPOINT": emulator.url}
    make = producer(emulator.url)
    samples: list[float] = []
    # The figure is the relay's sent_at less the commit's return: how often it is read
    # changes nothing but the pace of the orders (each waits for its task).
    pause = 0.0005 if isinstance(caller, SqlCaller) else 0.002
    with RelayThread(caller.url, relay_producer(env), poll=0.005):
        for i in range(n):
            entry = caller.order(f"lat-{i}", make)
            committed = time.time()
            assert entry is not None
            while (sent := caller.sent_at(entry)) is None:
                time.sleep(pause)
            samples.append(sent - committed)
    caller.close()
    ms = [s * 1000 for s in samples]
    print(
        f"{name:9} commit->task created ({caller.fast_path}): n={n} p50={pct(ms, 50):.1f} ms "
        f"p99={pct(ms, 99):.1f} ms max={max(ms):.1f} ms"
    )


def throughput(name: str, caller: Caller, emulator: Any, n: int) -> None:
    caller.stage(producer(emulator.url), [(f"tp-{i}", {"i": i}) for i in range(n)])
    caller.close()
    db = open_outbox(caller.url)
    relay = Relay(db, relay_producer({"TASKLEASE_TASKS_ENDPOINT": emulator.url}))
    started = time.perf_counter()
    done = relay.drain()
    elapsed = time.perf_counter() - started
    db.close()
    assert done.sent == n, done
    rate = n / elapsed
    print(f"{name:9} relay throughput: {n} waiting entries in {elapsed:.2f} s = {rate:,.0f}/s")


def cost(name: str, caller: Caller, n: int) -> None:
    make = producer("http://127.0.0.1:9")

    def run(prefix: str, enqueue: bool) -> float:
        started = time.perf_counter()
        for i in range(n):
            caller.order(f"{prefix}{i}", make if enqueue else None)
        return (time.perf_counter() - started) / n * 1e6

    run("warm-", True)
    bare = statistics.median([run(f"b{r}-", False) for r in range(3)])
    outbox = statistics.median([run(f"o{r}-", True) for r in range(3)])
    caller.close()
    extra = {"postgres": " + NOTIFY", "firestore": " (create) + one read outside it"}
    extra["spanner"] = " mutation + one read of its key"
    print(
        f"{name:9} caller's transaction: {bare:.0f} us bare, {outbox:.0f} us with the enqueue "
        f"(+{outbox - bare:.0f} us, x{outbox / bare:.2f}); the enqueue is one insert"
        f"{extra.get(name, '')}"
    )


STORES = ("postgres", "sqlite", "firestore", "spanner")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", type=int, default=300)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--cost", type=int, default=2000)
    parser.add_argument(
        "--stores", default=",".join(STORES), help=f"comma-separated, of {', '.join(STORES)}"
    )
    args = parser.parse_args()
    stores = args.stores.split(",")
    if unknown := set(stores) - set(STORES):
        parser.error(f"unknown stores {sorted(unknown)}")
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        emulator = stack.enter_context(CloudTasksEmulator(scheduler_on_schedule=False, grpc_port=0))
        emulator.create_queue(QUEUE_PATH, state="PAUSED")  # Count creates, dispatch none.
        setups: dict[str, Callable[[str], Caller]] = {}
        if "postgres" in stores:
            base = stack.enter_context(running_cluster(durable=True)).url()
            setups["postgres"] = lambda tag: pg_caller(base, f"bench_{tag}")
        if "sqlite" in stores:
            setups["sqlite"] = lambda tag: sqlite_caller(Path(tmp) / f"{tag}.db")
        if "firestore" in stores:
            host = stack.enter_context(run_gcloud_emulator())
            os.environ["FIRESTORE_EMULATOR_HOST"] = host
            setups["firestore"] = lambda tag: FirestoreCaller(f"bench-{tag}-{uuid.uuid4().hex[:6]}")
        if "spanner" in stores:
            spanner_host = stack.enter_context(run_emulator()).host
            os.environ["SPANNER_EMULATOR_HOST"] = spanner_host
            setups["spanner"] = lambda tag: SpannerCaller(create_database(spanner_host))
        for name in (store for store in STORES if store in setups):
            setup = setups[name]
            latency(name, setup("lat"), emulator, args.latency)
            throughput(name, setup("tp"), emulator, args.entries)
            cost(name, setup("cost"), args.cost)


if __name__ == "__main__":
    main()
