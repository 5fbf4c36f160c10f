"""One exactly-once unit of database work, in process: insert a row and record it as done,
in one transaction. tasklease's transactional handler on PostgresStore against DBOS
Transact's transaction step inside a workflow, on the same private PostgreSQL cluster (fsync
on), in the same run. Prints both throughputs, the ratio and the round trips per unit.

    python -m bench.dbos_compare [--units 2000] [--threads 1 8]

tasklease: ``Executor.execute`` of a task delivery (no HTTP) whose handler, registered
``transactional=True``, inserts the row through ``ctx.transaction``. DBOS 3 (``dbos`` from
PyPI; DBOS 3 replaced ``@DBOS.transaction`` by a datasource's ``@ds.transaction()``): a
``@DBOS.workflow()`` started with ``SetWorkflowID(key)`` that calls a transaction step
inserting the row. Each side's units are new (first executions), with a key per unit.

Round trips are counted at psycopg, as they go on the wire: each statement or command sent
outside pipeline mode is one; in pipeline mode each Sync is one (``Pipeline.sync()``, and the
one psycopg sends itself on leaving a ``pipeline()`` block or in ``executemany``) and each
fetch that must flush and wait for its result is one. Both sides use psycopg 3.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
from dbos import DBOS, SetWorkflowID, SQLAlchemyDatasource
from psycopg._pipeline_base import BasePipeline

from bench.common import ROOT
from tasklease.worker.auth.authenticators import NoAuth
from tasklease.worker.core.identity import Kind
from tasklease.worker.delivery.executor import Delivery, Executor
from tasklease.worker.handlers.router import Router
from tasklease.worker.stores.postgres.store import PostgresStore

sys.path.insert(0, str(ROOT))
from tests.support.postgres import running_cluster


class RoundTrips:
    """Counts what psycopg sends and waits for, per thread (see the module docstring)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self.enabled = threading.local()

    def add(self) -> None:
        if getattr(self.enabled, "on", False):
            with self._lock:
                self.count += 1

    @contextmanager
    def installed(self) -> Iterator[None]:
        cursor_execute = psycopg.Cursor.execute
        exec_command = psycopg.Connection._exec_command
        enqueue_sync = BasePipeline._enqueue_sync
        fetch_pipeline = psycopg.Cursor._fetch_pipeline
        counter = self

        def execute(cursor: Any, *args: Any, **kwargs: Any) -> Any:
            if cursor.connection._pipeline is None:
                counter.add()
            return cursor_execute(cursor, *args, **kwargs)

        def command(connection: Any, *args: Any, **kwargs: Any) -> Any:
            if connection._pipeline is None:
                counter.add()
            return exec_command(connection, *args, **kwargs)

        def synced(pipeline: Any) -> None:
            counter.add()  # Pipeline.sync(), leaving a pipeline() block, executemany.
            enqueue_sync(pipeline)

        def fetched(cursor: Any) -> None:
            # The condition under which psycopg's Cursor._fetch_pipeline flushes and waits.
            pending = cursor._execmany_returning is not False and not cursor.pgresult
            if pending and cursor.connection._pipeline is not None:
                counter.add()
            fetch_pipeline(cursor)

        psycopg.Cursor.execute = execute  # type: ignore[method-assign,assignment]
        psycopg.Connection._exec_command = command  # type: ignore[method-assign,assignment]
        BasePipeline._enqueue_sync = synced  # type: ignore[method-assign,assignment]
        psycopg.Cursor._fetch_pipeline = fetched  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            psycopg.Cursor.execute = cursor_execute  # type: ignore[method-assign]
            psycopg.Connection._exec_command = exec_command  # type: ignore[method-assign]
            BasePipeline._enqueue_sync = enqueue_sync  # type: ignore[method-assign]
            psycopg.Cursor._fetch_pipeline = fetch_pipeline  # type: ignore[method-assign]


def tasklease_unit(url: str) -> tuple[Callable[[str], None], Callable[[], None]]:
    store = PostgresStore.from_url(f"{url}?schema=bench_tl&max_size=16")
    store.get("warm-up")
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS bench_tl.items (key text NOT NULL)")
    router = Router()

    @router.task("insert", transactional=True)
    def insert(payload: Any, ctx: Any) -> None:
        ctx.transaction.execute("INSERT INTO bench_tl.items VALUES (%s)", (ctx.task_name,))

    executor = Executor(router, store, NoAuth())

    def unit(key: str) -> None:
        headers = {
            "x-cloudtasks-queuename": ["bench"],
            "x-cloudtasks-taskname": [key],
            "x-cloudtasks-taskretrycount": ["0"],
            "x-cloudtasks-taskexecutioncount": ["0"],
        }
        reply = executor.execute(
            Delivery(
                kind=Kind.TASK,
                handler="insert",
                header=lambda name: headers.get(name.lower(), []),
                query={},
                body=b"{}",
                url="/tasks/insert",
            )
        )
        assert reply.status == 200, reply.message

    return unit, store.close


def dbos_unit(url: str) -> tuple[Callable[[str], None], Callable[[], None]]:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("CREATE SCHEMA IF NOT EXISTS bench_dbos")
        connection.execute("CREATE TABLE IF NOT EXISTS bench_dbos.items (key text NOT NULL)")
    sa_url = url.replace("postgresql://", "postgresql+psycopg://")
    DBOS(config={"name": "bench", "system_database_url": sa_url, "log_level": "WARNING"})
    datasource = SQLAlchemyDatasource.create(sa_url, engine_kwargs={"pool_size": 16})

    @datasource.transaction(isolation_level="READ COMMITTED")
    def insert(key: str) -> None:
        datasource.sql_session().execute(
            sa.text("INSERT INTO bench_dbos.items VALUES (:key)"), {"key": key}
        )

    @DBOS.workflow()
    def workflow(key: str) -> None:
        insert(key)

    DBOS.launch()

    def unit(key: str) -> None:
        with SetWorkflowID(key):
            workflow(key)

    return unit, DBOS.destroy


def measure(
    unit: Callable[[str], None], units: int, threads: int, trips: RoundTrips
) -> tuple[float, float]:
    """Units per second and round trips per unit, over ``threads`` threads."""
    each = units // threads
    keys = [[uuid.uuid4().hex for _ in range(each)] for _ in range(threads)]

    def run(mine: list[str]) -> None:
        trips.enabled.on = True
        for key in mine:
            unit(key)

    for key in [uuid.uuid4().hex for _ in range(20)]:  # Warm up pools and caches.
        unit(key)
    before = trips.count
    workers = [threading.Thread(target=run, args=(k,)) for k in keys]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - started
    return each * threads / seconds, (trips.count - before) / (each * threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=2000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    trips = RoundTrips()
    with running_cluster(durable=True) as cluster, trips.installed():
        url = cluster.url()
        ours, close_ours = tasklease_unit(url)
        theirs, close_theirs = dbos_unit(url)
        try:
            print(f"one exactly-once insert + its record, {args.units} units, same cluster")
            print(f"  {'threads':<8}{'tasklease/s':>12}{'DBOS/s':>9}{'ratio':>7}"
                  f"{'trips tl':>9}{'trips DBOS':>11}")  # fmt: skip
            for threads in args.threads:
                ours_rate, ours_trips = measure(ours, args.units, threads, trips)
                theirs_rate, theirs_trips = measure(theirs, args.units, threads, trips)
                ratio = ours_rate / theirs_rate
                print(f"  {threads:<8}{ours_rate:>12.0f}{theirs_rate:>9.0f}{ratio:>6.2f}x"
                      f"{ours_trips:>9.1f}{theirs_trips:>11.1f}")  # fmt: skip
        finally:
            close_theirs()
            close_ours()


if __name__ == "__main__":
    main()
