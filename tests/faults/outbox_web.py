"""A web process of the outbox proofs: order transactions that enqueue their task, with a relay.

``python -m tests.faults.outbox_web URL START END ROLLBACK_EVERY``: for each n, one transaction
inserts order n and enqueues ``record`` through it; every ROLLBACK_EVERY-th rolls back. A
following relay runs in the process (the fast path), so a SIGKILL lands between commit and relay.
Prints ``committed n`` after each commit.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from functools import partial
from typing import Any

from tasklease.outbox import RelayThread, relay_producer
from tests.support.outbox import producer, spanner_database


def connect(url: str) -> Any:
    if url.startswith("sqlite:///"):
        return sqlite3.connect(url[len("sqlite:///") :], timeout=30)
    import psycopg  # noqa: PLC0415

    base, schema = url.split("?schema=")
    return psycopg.connect(base, options=f"-c search_path={schema}")


class RolledBack(Exception):
    """Raised inside a Firestore or Spanner transaction to roll it back."""


def firestore_orders(url: str, start: int, end: int, rollback_every: int) -> None:
    """The same orders as Firestore transactions: the order document and its entry."""
    from google.cloud import firestore  # noqa: PLC0415

    client = firestore.Client(project=url.split("project=")[1])
    make = producer(os.environ["TASKLEASE_TASKS_ENDPOINT"], os.environ["TASKLEASE_WORKER_URL"])

    @firestore.transactional
    def order(tx: Any, n: int) -> None:
        tx.set(client.collection("orders").document(str(n)), {"n": n})
        make.enqueue("record", {"n": n}, key=f"order-{n}", transaction=tx)
        if rollback_every and n % rollback_every == 0:
            raise RolledBack

    for n in range(start, end):
        try:
            order(client.transaction(), n)
        except RolledBack:
            continue
        print(f"committed {n}", flush=True)
        time.sleep(0.005)


def spanner_orders(url: str, start: int, end: int, rollback_every: int) -> None:
    """The same orders as Spanner transactions: the order row and its entry. Run again on
    contention as the Spanner store does (the emulator runs one transaction at a time)."""
    from tasklease.plumbing.spanner_calls import run_transaction  # noqa: PLC0415

    database = spanner_database(url)
    make = producer(os.environ["TASKLEASE_TASKS_ENDPOINT"], os.environ["TASKLEASE_WORKER_URL"])

    def order(tx: Any, n: int) -> None:
        tx.insert("orders", ("id", "n"), [[str(n), n]])
        make.enqueue("record", {"n": n}, key=f"order-{n}", transaction=tx)
        if rollback_every and n % rollback_every == 0:
            raise RolledBack

    for n in range(start, end):
        try:
            run_transaction(database, partial(order, n=n), 60, "place an order")
        except RolledBack:
            continue
        print(f"committed {n}", flush=True)
        time.sleep(0.005)


def main() -> None:
    url, start, end, rollback_every = sys.argv[1], *map(int, sys.argv[2:5])
    endpoint = os.environ["TASKLEASE_TASKS_ENDPOINT"]
    make = producer(endpoint, os.environ["TASKLEASE_WORKER_URL"])
    if url.startswith("firestore://"):
        with RelayThread(url, relay_producer(), poll=0.02, lease=2.0):
            firestore_orders(url, start, end, rollback_every)
            print("done", flush=True)
        return
    if url.startswith("spanner://"):
        with RelayThread(url, relay_producer(), poll=0.02, lease=2.0):
            spanner_orders(url, start, end, rollback_every)
            print("done", flush=True)
        return
    conn = connect(url)
    with RelayThread(url, relay_producer(), poll=0.02, lease=2.0):
        for n in range(start, end):
            cursor = conn.cursor()
            mark = "?" if isinstance(conn, sqlite3.Connection) else "%s"
            cursor.execute(f"INSERT INTO orders VALUES ({mark})", (str(n),))
            make.enqueue("record", {"n": n}, key=f"order-{n}", transaction=conn)
            if rollback_every and n % rollback_every == 0:
                conn.rollback()
                continue
            conn.commit()
            print(f"committed {n}", flush=True)
            time.sleep(0.005)  # A request's pace: the in-process relay keeps up between them.
        print("done", flush=True)


if __name__ == "__main__":
    main()
