"""The outbox's proofs with real processes: a web process SIGKILLed between commit and relay,
relays racing, Cloud Tasks down; every committed order's task executed once, none for a
rolled-back one; on SQLite, Postgres, Firestore and Spanner (Google's emulators). Reduced
scale by default; ``TASKLEASE_FAULTS=full`` runs the brief's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tasklease.demo.ledger import Ledger
from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator.scheduler import Job
from tasklease.outbox import SWEEP_JOB, open_outbox
from tasklease.plumbing.serve import GunicornWorker, free_port
from tests.faults.harness import FULL, scale
from tests.support import postgres as postgres_support
from tests.support.outbox import (
    QUEUE_PATH,
    SPANNER_ORDERS,
    producer,
    spanner_database,
    sqlite_app_db,
)

pytestmark = pytest.mark.faults

ROLLBACK_EVERY = 7  # Orders n with n % 7 == 0 roll back.


@dataclass
class Stack:
    url: str
    emulator: CloudTasksEmulator
    worker: GunicornWorker
    ledger: Ledger
    env: dict[str, str]
    data_dir: Path
    port: int
    stopped: bool = False

    def pending(self) -> int:
        db = open_outbox(self.url)
        try:
            return db.status(time.time()).depth
        finally:
            db.close()

    def errors(self) -> list[tuple[str, float]]:
        """Some pending entries' last errors and when they are due, to say why they wait."""
        import sqlite3  # noqa: PLC0415

        if not self.url.startswith("sqlite:///"):
            return []
        with sqlite3.connect(self.url[len("sqlite:///") :]) as conn:
            query = "SELECT last_error, next_attempt_at - ? FROM tasklease_outbox "
            query += "WHERE state = 'pending' LIMIT 3"
            return list(conn.execute(query, (time.time(),)))

    def sweep_until_empty(self, timeout: float = 120) -> None:
        """The operator's relay (``tasklease outbox relay``), until nothing is pending."""
        deadline = time.monotonic() + timeout
        while self.pending():
            assert time.monotonic() < deadline, f"{self.pending()} still pending: {self.errors()}"
            subprocess.run(
                [sys.executable, "-m", "tasklease.cli", "outbox", "relay", "--url", self.url],
                env=self.env,
                capture_output=True,
                check=False,
                timeout=60,
            )
            time.sleep(0.2)


def sweep_job(worker: GunicornWorker) -> Job:
    return Job(name=SWEEP_JOB, schedule="* * * * *", url=f"{worker.url}/jobs/{SWEEP_JOB}")


@pytest.fixture(
    params=[
        "sqlite",
        "postgres",
        # A killed Firestore transaction holds its locks ~30 s on the emulator: full suite only
        # (tests/outbox/test_outbox_firestore.py covers the adapter in every run).
        pytest.param(
            "firestore",
            marks=pytest.mark.skipif(not FULL, reason="in the full suite only (make faults)"),
        ),
        # The emulator runs one read-write transaction at a time: slow at scale; full suite
        # only (tests/outbox/test_outbox_spanner.py covers the adapter in every run).
        pytest.param(
            "spanner",
            marks=pytest.mark.skipif(not FULL, reason="in the full suite only (make faults)"),
        ),
    ]
)
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    if request.param == "sqlite":
        url = sqlite_app_db(tmp_path / "app.db")
    elif request.param == "spanner":
        url = spanner_app_db(request.getfixturevalue("spanner_database"))
    elif request.param == "firestore":
        request.getfixturevalue("firestore_host")  # Sets FIRESTORE_EMULATOR_HOST for all.
        url = f"firestore://?project=outbox-{uuid.uuid4().hex[:10]}"
    else:
        cluster: postgres_support.Cluster = request.getfixturevalue("postgres_cluster")
        schema = postgres_support.fresh_schema()
        url = cluster.url(schema=schema)
        db = open_outbox(url)
        db.migrate()
        db.close()
        cluster.sql(f"CREATE TABLE {schema}.orders (id TEXT PRIMARY KEY)")
    port = free_port()
    env = {
        **os.environ,
        "TEST_LEDGER": str(tmp_path / "ledger.db"),
        "TASKLEASE_OUTBOX_URL": url,
        "TASKLEASE_TASKS_ENDPOINT": f"http://127.0.0.1:{port}",
    }
    worker = GunicornWorker(
        "tests.faults.outbox_app:router",
        store=f"sqlite:///{tmp_path}/runs.db",
        workers=2,
        env=env,
        log_path=tmp_path / "worker.log",
    )
    env["TASKLEASE_WORKER_URL"] = worker.url
    data_dir = tmp_path / "emulator"
    emulator = CloudTasksEmulator(
        data_dir=data_dir,
        port=port,
        grpc_port=0,
        jobs=[sweep_job(worker)],
        scheduler_on_schedule=False,
    ).start()
    emulator.create_queue(QUEUE_PATH, retryConfig={"minBackoff": "0.05s", "maxBackoff": "1s"})
    stack = Stack(url, emulator, worker, Ledger(tmp_path / "ledger.db"), env, data_dir, port)
    try:
        with worker:
            yield stack
    finally:
        if not stack.stopped:
            stack.emulator.stop()


def spanner_app_db(database: str) -> str:
    """The outbox and an ``orders`` table in the Spanner ``database``; its outbox URL."""
    url = f"spanner://{database}"
    db = open_outbox(url)
    db.migrate()
    db.close()
    spanner_database(url).update_ddl([SPANNER_ORDERS]).result(120)
    return url


def committed_orders(url: str) -> set[int]:
    if url.startswith("spanner://"):
        with spanner_database(url).snapshot() as snapshot:
            return {int(row[0]) for row in snapshot.execute_sql("SELECT id FROM orders")}
    if url.startswith("firestore://"):
        from google.cloud import firestore  # noqa: PLC0415

        client = firestore.Client(project=url.split("project=")[1])
        try:
            return {int(doc.id) for doc in client.collection("orders").stream()}
        finally:
            client.close()  # type: ignore[no-untyped-call]
    if url.startswith("sqlite:///"):
        import sqlite3  # noqa: PLC0415

        with sqlite3.connect(url[len("sqlite:///") :]) as conn:
            return {int(row[0]) for row in conn.execute("SELECT id FROM orders")}
    import psycopg  # noqa: PLC0415

    base, schema = url.split("?schema=")
    with psycopg.connect(base, options=f"-c search_path={schema}") as conn:
        return {int(row[0]) for row in conn.execute("SELECT id FROM orders")}


def web(stack: Stack, start: int, end: int) -> subprocess.Popen[str]:
    # Its stderr to a file that says why a web process failed (the child keeps its own fd).
    with (stack.data_dir.parent / "web.log").open("a") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.faults.outbox_web",
                stack.url,
                str(start),
                str(end),
                str(ROLLBACK_EVERY),
            ],
            env=stack.env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )


def executions_once_each(stack: Stack, expected: set[int]) -> None:
    """Every expected order's task created once and executed once; nothing else."""
    stack.emulator.join(QUEUE_PATH, timeout=180)
    counts = stack.ledger.counts("record")
    assert set(counts) == {f"record:{n}" for n in expected}
    assert set(counts.values()) == {1}
    created = {d.name for d in stack.emulator.deliveries(QUEUE_PATH) if d.kind == "task"}
    assert len(created) == len(expected)


def test_sigkill_of_the_web_process_between_commit_and_relay_loses_and_duplicates_nothing(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    total, kills = scale(200, 1000), scale(5, 25)
    start, pending_at_kill = 0, []
    for kill in range(kills + 1):
        process = web(stack, start, total)
        assert process.stdout is not None
        if kill < kills:
            wanted = max(1, (total - start) // (kills - kill + 1))
            seen = 0
            for line in process.stdout:
                if line.startswith("committed"):
                    seen += 1
                    if seen >= wanted:
                        break
            process.send_signal(signal.SIGKILL)  # Right after a commit: its relay not yet.
            process.wait(timeout=30)
            pending_at_kill.append(stack.pending())
        else:
            assert process.wait(timeout=300) == 0
        process.stdout.close()
        start = max(committed_orders(stack.url), default=-1) + 1
    stack.sweep_until_empty()
    committed = committed_orders(stack.url)
    assert committed == {n for n in range(total) if n % ROLLBACK_EVERY}
    executions_once_each(stack, committed)
    with capsys.disabled():
        print(
            f"\noutbox kill: {kills} SIGKILLs over {total} transactions, committed "
            f"{len(committed)}, executed once each, rolled back {total - len(committed)} with 0 "
            f"tasks; entries pending at each kill {pending_at_kill}"
        )
    assert any(pending_at_kill)  # The kills did land between a commit and its relay.


def test_rolled_back_transactions_create_no_task(stack: Stack) -> None:
    total = scale(100, 500)
    process = web(stack, 0, total)
    env = {**stack.env}
    process.communicate(timeout=300)
    # Every transaction rolls back (ROLLBACK_EVERY=1).
    rollback = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.faults.outbox_web",
            stack.url,
            str(total),
            str(2 * total),
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "committed" not in rollback.stdout
    stack.sweep_until_empty()
    committed = committed_orders(stack.url)
    assert all(n < total for n in committed)
    executions_once_each(stack, committed)


def test_two_relays_and_the_sweeper_racing_create_one_task_each(stack: Stack) -> None:
    total = scale(300, 1000)
    db = open_outbox(stack.url)
    _stage(stack, total)
    relays = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tasklease.cli",
                "outbox",
                "relay",
                "--follow",
                "--url",
                stack.url,
                "--poll",
                "0.05",
            ],
            env=stack.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    try:
        stack.emulator.scheduler.run_job(SWEEP_JOB)  # The sweeper job, through the worker.
        deadline = time.monotonic() + 120
        while db.status(time.time()).depth and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for relay in relays:
            relay.send_signal(signal.SIGTERM)
        for relay in relays:
            relay.wait(timeout=30)
        db.close()
    assert stack.pending() == 0
    executions_once_each(stack, set(range(total)))


def test_cloud_tasks_down_entries_wait_back_off_and_are_delivered_once_after(
    stack: Stack,
) -> None:
    total, down = scale(200, 1000), scale(3, 30)
    relay = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tasklease.cli",
            "outbox",
            "relay",
            "--follow",
            "--url",
            stack.url,
            "--poll",
            "0.05",
        ],
        env=stack.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        stack.emulator.stop()
        stack.stopped = True
        _stage(stack, total)
        time.sleep(down)
        deadline = time.monotonic() + 30
        while True:  # The relay tried, failed and backs off (its first try may take a while).
            db = open_outbox(stack.url)
            during = db.status(time.time())
            db.close()
            assert during.sent == 0 and during.depth == total  # Nothing marked sent.
            if during.retrying == total or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert during.retrying == total
        stack.stopped = False
        stack.emulator = CloudTasksEmulator(
            data_dir=stack.data_dir, port=stack.port, grpc_port=0, jobs=[sweep_job(stack.worker)]
        ).start()
        deadline = time.monotonic() + 180
        while stack.pending() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.wait(timeout=30)
    assert stack.pending() == 0
    executions_once_each(stack, set(range(total)))


def _stage(stack: Stack, total: int) -> None:
    """``total`` committed entries, ``record`` n for n in range(total), in one transaction."""
    endpoint = stack.env["TASKLEASE_TASKS_ENDPOINT"]
    make = producer(endpoint, stack.env["TASKLEASE_WORKER_URL"])
    items = [(f"order-{n}", {"n": n}) for n in range(total)]
    if stack.url.startswith("firestore://"):
        from google.cloud import firestore  # noqa: PLC0415

        client = firestore.Client(project=stack.url.split("project=")[1])

        @firestore.transactional
        def stage(tx: Any, chunk: list[tuple[str, Any]]) -> None:
            make.enqueue_many("record", chunk, transaction=tx)

        for start in range(0, total, 250):  # A commit's writes stay within Firestore's limit.
            stage(client.transaction(), items[start : start + 250])
        client.close()  # type: ignore[no-untyped-call]
        return
    if stack.url.startswith("spanner://"):
        database = spanner_database(stack.url)
        for start in range(0, total, 250):
            chunk = items[start : start + 250]
            database.run_in_transaction(
                lambda tx, chunk=chunk: make.enqueue_many("record", chunk, transaction=tx)
            )
        return
    if stack.url.startswith("sqlite:///"):
        import sqlite3  # noqa: PLC0415

        conn = sqlite3.connect(stack.url[len("sqlite:///") :])
        conn.execute("BEGIN")
        make.enqueue_many("record", items, transaction=conn)
        conn.commit()
        conn.close()
        return
    import psycopg  # noqa: PLC0415

    base, schema = stack.url.split("?schema=")
    with psycopg.connect(base, options=f"-c search_path={schema}") as pg:
        make.enqueue_many("record", items, transaction=pg)
