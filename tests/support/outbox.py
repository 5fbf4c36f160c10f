"""Shared by the outbox tests: an app database with an orders table and the outbox."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import Relay, relay_producer
from tasklease.outbox.db import OutboxDB, open_outbox
from tasklease.producer import Producer

PROJECT, LOCATION, QUEUE = "p", "us-central1", "outbox"
WORKER = "http://127.0.0.1:9"  # The tests' worker URL: the producers' and the relays'.
QUEUE_PATH = f"projects/{PROJECT}/locations/{LOCATION}/queues/{QUEUE}"
SPANNER_ORDERS = "CREATE TABLE orders (id STRING(64) NOT NULL, n INT64) PRIMARY KEY (id)"


def sqlite_app_db(path: Path) -> str:
    """A SQLite file with ``orders`` and ``tasklease_outbox``; its outbox URL."""
    url = f"sqlite:///{path}"
    db = open_outbox(url)
    db.migrate()
    db.close()
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)")
    return url


def producer(tasks_endpoint: str, worker_url: str = WORKER) -> Producer:
    return Producer(PROJECT, LOCATION, QUEUE, worker_url, tasks_endpoint=tasks_endpoint)


def relay_env(tasks_endpoint: str) -> dict[str, str]:
    """A relay's settings: the Cloud Tasks endpoint, and the worker its entries may go to."""
    return {"TASKLEASE_TASKS_ENDPOINT": tasks_endpoint, "TASKLEASE_WORKER_URL": WORKER}


def spanner_database(url: str) -> Any:
    """The caller's ``spanner.Database`` of a ``spanner://projects/P/instances/I/databases/D``
    outbox URL (the emulator's, through ``SPANNER_EMULATOR_HOST``)."""
    from google.cloud import spanner  # noqa: PLC0415 - the spanner extra.

    _, project, _, instance, _, name = url[len("spanner://") :].split("/")
    client = spanner.Client(project=project)
    return client.instance(instance).database(name)  # type: ignore[no-untyped-call]


def pg_connect(url: str, **options: Any) -> psycopg.Connection[Any]:
    """A connection to a ``postgresql://...?schema=S`` outbox URL's database, in schema S."""
    base, schema = url.split("?schema=")
    return psycopg.connect(base, options=f"-c search_path={schema}", **options)


def task_names(emulator: CloudTasksEmulator) -> list[str]:
    """The ids of the tasks the relay created in the (held) outbox queue, sorted."""
    listed = emulator.client().list_tasks(parent=QUEUE_PATH)
    return sorted(task.name.rsplit("/", 1)[1] for task in listed)


class Outboxes:
    """Opens a test's outboxes and their relays; ``close`` closes every one it opened."""

    def __init__(self) -> None:
        self._opened: list[OutboxDB] = []

    def open(self, url: str, kind: type[OutboxDB] = OutboxDB) -> OutboxDB:
        """The outbox at ``url``, which must be a ``kind``."""
        db = open_outbox(url)
        self._opened.append(db)
        assert isinstance(db, kind)
        return db

    def relay_for(
        self, url: str, emulator: CloudTasksEmulator, kind: type[OutboxDB] = OutboxDB
    ) -> tuple[OutboxDB, Relay]:
        """The outbox at ``url`` and a relay from it to ``emulator``."""
        db = self.open(url, kind)
        return db, Relay(db, relay_producer(relay_env(emulator.url)))

    def close(self) -> None:
        while self._opened:
            self._opened.pop().close()


def drain_at_once(relays: Sequence[Relay], batch: int) -> list[int]:
    """Every relay drains at the same time, each on a thread of its own, claiming ``batch``
    entries at a time; what each claimed in all."""
    claimed: list[int] = []

    def run(relay: Relay) -> None:
        relay.batch = batch
        claimed.append(relay.drain().claimed)

    threads = [threading.Thread(target=run, args=(relay,)) for relay in relays]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return claimed
