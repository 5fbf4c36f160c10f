"""Finding: the relay's destination check splits each entry's URL and audience with
``urllib.parse.urlsplit``, which raises ``ValueError`` for a bracket it cannot read as an
IPv6 host (``https://[``, ``https://w.run.app]/x``). That error escapes the round: no entry
of the claimed batch is sent or marked, and after the lease the same batch is claimed and
fails again, so one inserted row stops the relay for every entry. Such a row must be marked
failed with the reason, and the rest sent."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import Relay, open_outbox, relay_producer
from tasklease.outbox.destinations import Destinations
from tasklease.outbox.entries import TABLE
from tasklease.producer import task_id
from tasklease.producer.transport import TaskRequest
from tests.outbox_support import QUEUE_PATH, producer, relay_env, sqlite_app_db

UNSPLITTABLE = ("https://[", "https://w.run.app]/tasks/x", "https://[w.run.app]/tasks/x")


@pytest.fixture
def tasks() -> Iterator[CloudTasksEmulator]:
    with CloudTasksEmulator(scheduler_on_schedule=False) as emulator:
        emulator.create_queue(QUEUE_PATH, state="PAUSED")  # Held: the test counts creates.
        yield emulator


@pytest.mark.parametrize("url", UNSPLITTABLE)
def test_a_url_that_cannot_be_split_is_a_refusal(url: str) -> None:
    allowed = Destinations.configured("https://w.run.app")
    request = TaskRequest(QUEUE_PATH, "t", url, b"{}")
    reason = allowed.refusal(request)
    assert reason is not None and reason.startswith("refused to send to URL")


@pytest.mark.parametrize("column", ["url", "audience"])
def test_one_unsplittable_row_does_not_stop_the_others(
    tmp_path: Path, tasks: CloudTasksEmulator, column: str
) -> None:
    path = tmp_path / "app.db"
    url = sqlite_app_db(path)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("BEGIN")
        make = producer(tasks.url)
        items = [(key, {}) for key in ("first", "bad", "last")]
        results = make.enqueue_many("x", items, transaction=conn)
        conn.execute(
            f"UPDATE {TABLE} SET {column} = ?, service_account = ? WHERE id = ?",
            ("https://[", "invoker@p.iam.gserviceaccount.com", results[1].name),
        )
        conn.commit()
    db = open_outbox(url)
    try:
        done = Relay(db, relay_producer(relay_env(tasks.url))).drain()
        status = db.status(10**10)
    finally:
        db.close()
    listed = tasks.client().list_tasks(parent=QUEUE_PATH)
    created = sorted(task.name.rsplit("/", 1)[1] for task in listed)
    assert created == sorted(task_id("x", key) for key in ("first", "last"))
    assert (done.sent, done.failed, status.depth) == (2, 1, 0)
    assert [failed.id for failed in status.failed] == [results[1].name]
