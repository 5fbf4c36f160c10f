"""A write a transactional handler makes through ``ctx.transaction`` must be kept only with
the run's completion record. SQLite itself can end the transaction under the handler (a
``UNIQUE ON CONFLICT ROLLBACK`` column, a trigger's ``RAISE(ROLLBACK)``, SQLITE_FULL): the
store's connection is in autocommit mode, so the handler's next statements then commit on
their own, although the run is released and will run again."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.records import RunStatus
from tests.support.helpers import task_headers
from tests.support.stores import sqlite_store_with


def test_a_write_after_sqlite_rolled_the_transaction_back_is_not_kept_without_the_record(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    store = sqlite_store_with(
        path,
        "CREATE TABLE seen (k TEXT UNIQUE ON CONFLICT ROLLBACK)",
        "CREATE TABLE effects (k TEXT)",
        "INSERT INTO seen VALUES ('order-1')",
    )

    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        with contextlib.suppress(sqlite3.IntegrityError):  # Seen before: it goes on.
            ctx.transaction.execute("INSERT INTO seen VALUES ('order-1')")
        ctx.transaction.execute("INSERT INTO effects VALUES ('charged')")

    app = create_app(router, store=store, auth="none")
    client = app.test_client()
    for retry in range(2):
        client.post("/tasks/charge", headers=task_headers(retry=retry, execution=retry), data=b"{}")
    (record,) = store.list_runs()
    with sqlite3.connect(path) as connection:
        effects = connection.execute("SELECT count(*) FROM effects").fetchone()[0]
    completed = 1 if record.status is RunStatus.COMPLETED else 0
    assert (record.status.value, effects) == (record.status.value, completed)
    store.close()


def _deliver_once(tmp_path: Path, body: Any) -> tuple[RunStatus, int, str]:
    """Run ``body(tx)`` as a transactional handler once: (status, effects kept, error)."""
    path = tmp_path / "runs.db"
    store = sqlite_store_with(
        path,
        "CREATE TABLE effects (k TEXT)",
        "CREATE TRIGGER refuse BEFORE INSERT ON effects WHEN new.k = 'refused' "
        "BEGIN SELECT RAISE(ROLLBACK, 'refused by a trigger'); END",
    )
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        body(ctx.transaction)

    app = create_app(router, store=store, auth="none")
    app.test_client().post("/tasks/charge", headers=task_headers(), data=b"{}")
    (record,) = store.list_runs()
    with sqlite3.connect(path) as connection:
        effects = connection.execute("SELECT count(*) FROM effects").fetchone()[0]
    store.close()
    return record.status, effects, record.error or ""


def test_a_handler_that_swallows_the_refusal_after_a_trigger_rollback_keeps_nothing(
    tmp_path: Path,
) -> None:
    def body(tx: Any) -> None:
        tx.execute("INSERT INTO effects VALUES ('before')")
        with contextlib.suppress(sqlite3.IntegrityError):
            tx.execute("INSERT INTO effects VALUES ('refused')")
        with contextlib.suppress(RuntimeError):
            tx.execute("INSERT INTO effects VALUES ('after')")

    status, effects, error = _deliver_once(tmp_path, body)
    assert (status, effects) == (RunStatus.RELEASED, 0)
    assert "has ended" in error


@pytest.mark.parametrize(
    "end",
    [
        lambda tx: tx.commit(),
        lambda tx: tx.execute("COMMIT"),
        lambda tx: tx.cursor().execute("  -- done\n END"),
        lambda tx: tx.executescript("SELECT 1"),
        lambda tx: setattr(tx, "isolation_level", "DEFERRED"),
        lambda tx: tx.__enter__(),
    ],
    ids=["commit", "COMMIT", "cursor-END", "executescript", "isolation_level", "with"],
)
def test_a_handler_cannot_commit_its_writes_without_the_record(tmp_path: Path, end: Any) -> None:
    def body(tx: Any) -> None:
        tx.execute("INSERT INTO effects VALUES ('before')")
        end(tx)

    status, effects, error = _deliver_once(tmp_path, body)
    assert (status, effects) == (RunStatus.RELEASED, 0)
    assert "refuses" in error
