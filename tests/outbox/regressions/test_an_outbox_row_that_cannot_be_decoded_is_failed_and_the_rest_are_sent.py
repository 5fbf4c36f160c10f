"""Finding: the relay decoded a claimed batch all at once, after the claim had committed.
One row it could not decode (headers that are not JSON, a time out of range, written by hand
or by another version) raised out of the round: no entry of the batch was sent or marked, and
after the lease the same batch was claimed and failed again, so nothing in the outbox was
relayed any more. Each row is decoded on its own in the claim; a bad one is marked failed with
the reason (``tasklease outbox status``, the dashboard) and the rest are sent. On every
outbox backend."""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import Relay, open_outbox, relay_producer
from tasklease.outbox.entries import TABLE
from tasklease.outbox.firestore import doc_id
from tasklease.producer import EnqueueResult, task_id
from tests.support import postgres as postgres_support
from tests.support.outbox import (
    SPANNER_ORDERS,
    producer,
    relay_env,
    spanner_database,
    sqlite_app_db,
    task_names,
)

KEYS = ("first", "bad", "last")
BAD_HEADERS = "{not json"


# Each backend: (outbox URL, stage KEYS through the caller's transaction and return the name
# of the "bad" entry, damage that entry's column ``column`` with ``value``).
Backend = tuple[str, Callable[[], str], Callable[[str, str, Any], None]]


def _sqlite(tmp_path: Path, endpoint: str) -> Backend:
    path = tmp_path / "app.db"
    url = sqlite_app_db(path)

    def stage() -> str:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("BEGIN")
            items: list[tuple[str, Any]] = [(k, {}) for k in KEYS]
            results = producer(endpoint).enqueue_many("x", items, transaction=conn)
            conn.commit()
        return results[1].name

    def damage(name: str, column: str, value: Any) -> None:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute(f"UPDATE {TABLE} SET {column} = ? WHERE id = ?", (value, name))
            conn.commit()

    return url, stage, damage


def _postgres(cluster: postgres_support.Cluster, endpoint: str) -> Backend:
    url = cluster.url(schema=postgres_support.fresh_schema())
    db = open_outbox(url)
    db.migrate()
    db.close()
    conninfo, schema = cluster.url(), url.rsplit("schema=", 1)[1]

    def connect() -> psycopg.Connection[Any]:
        conn = psycopg.connect(conninfo)
        conn.execute(f'SET search_path TO "{schema}"')
        return conn

    def stage() -> str:
        with connect() as conn:
            items: list[tuple[str, Any]] = [(k, {}) for k in KEYS]
            results = producer(endpoint).enqueue_many("x", items, transaction=conn)
        return results[1].name

    def damage(name: str, column: str, value: Any) -> None:
        with connect() as conn:
            conn.execute(f"UPDATE {TABLE} SET {column} = %s WHERE id = %s", (value, name))

    return url, stage, damage


def _firestore(client: Any, endpoint: str) -> Backend:
    from google.cloud import firestore  # noqa: PLC0415 - the firestore extra.

    def stage() -> str:
        results: list[EnqueueResult] = []

        @firestore.transactional
        def checkout(tx: Any) -> None:
            items: list[tuple[str, Any]] = [(k, {}) for k in KEYS]
            results[:] = producer(endpoint).enqueue_many("x", items, transaction=tx)

        checkout(client.transaction())
        return results[1].name

    def damage(name: str, column: str, value: Any) -> None:
        client.collection(TABLE).document(doc_id(name)).update({column: value})

    return f"firestore://?project={client.project}", stage, damage


def _spanner(database_path: str, endpoint: str) -> Backend:
    url = f"spanner://{database_path}"
    db = open_outbox(url)
    db.migrate()
    db.close()
    database = spanner_database(url)
    database.update_ddl([SPANNER_ORDERS]).result(60)

    def stage() -> str:
        def checkout(tx: Any) -> list[EnqueueResult]:
            items: list[tuple[str, Any]] = [(k, {}) for k in KEYS]
            return producer(endpoint).enqueue_many("x", items, transaction=tx)

        results: list[EnqueueResult] = database.run_in_transaction(checkout)
        return results[1].name

    def damage(name: str, column: str, value: Any) -> None:
        database.run_in_transaction(lambda tx: tx.update(TABLE, ("id", column), [[name, value]]))

    return url, stage, damage


@pytest.fixture(params=["sqlite", "postgres", "firestore", "spanner"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, tasks: CloudTasksEmulator
) -> Iterator[Backend]:
    if request.param == "sqlite":
        yield _sqlite(tmp_path, tasks.url)
    elif request.param == "postgres":
        yield _postgres(request.getfixturevalue("postgres_cluster"), tasks.url)
    elif request.param == "firestore":
        from google.cloud import firestore  # noqa: PLC0415 - the firestore extra.

        request.getfixturevalue("firestore_host")
        client = firestore.Client(project=f"outbox-{uuid.uuid4().hex[:10]}")
        yield _firestore(client, tasks.url)
        client.close()  # type: ignore[no-untyped-call]
    else:
        yield _spanner(request.getfixturevalue("spanner_database"), tasks.url)


def _relay_all(url: str, endpoint: str) -> tuple[int, int, list[tuple[str, str]], int]:
    """(sent, failed, the failed entries' (task id, reason), still pending) after a drain."""
    db = open_outbox(url)
    try:
        done = Relay(db, relay_producer(relay_env(endpoint))).drain()
        status = db.status(10**10)
    finally:
        db.close()
    failed = [(entry.id.rsplit("/", 1)[1], entry.reason) for entry in status.failed]
    return done.sent, done.failed, failed, status.depth


def test_a_row_whose_headers_are_not_json_is_failed_and_the_rest_are_sent(
    backend: Backend, tasks: CloudTasksEmulator
) -> None:
    url, stage, damage = backend
    bad = stage()
    damage(bad, "headers", BAD_HEADERS)
    sent, failed, reasons, pending = _relay_all(url, tasks.url)
    assert task_names(tasks) == sorted(task_id("x", key) for key in ("first", "last"))
    assert (sent, failed, pending) == (2, 1, 0)
    [(failed_id, reason)] = reasons
    assert failed_id == task_id("x", "bad")
    assert reason.startswith("undecodable outbox entry: JSONDecodeError")


@pytest.mark.parametrize(
    ("column", "value", "why"),
    [
        ("schedule_time", 1e300, "undecodable outbox entry: OverflowError"),
        ("body", "text, not bytes", "undecodable outbox entry: TypeError"),
        ("task_id", "another-name", "its id is not the name its queue and task_id make"),
    ],
)
def test_any_row_that_cannot_be_read_back_as_its_entry_is_failed_with_the_reason(
    tmp_path: Path, tasks: CloudTasksEmulator, column: str, value: Any, why: str
) -> None:
    url, stage, damage = _sqlite(tmp_path, tasks.url)
    bad = stage()
    damage(bad, column, value)
    sent, failed, reasons, pending = _relay_all(url, tasks.url)
    assert (sent, failed, pending) == (2, 1, 0)
    assert sorted(task_names(tasks)) == sorted(task_id("x", key) for key in ("first", "last"))
    [(_, reason)] = reasons
    assert why in reason
