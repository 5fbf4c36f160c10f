"""Shared by the outbox tests: an app database with an orders table and the outbox."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from tasklease.outbox.db import open_outbox
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
