"""Finding: the relay's destination check could raise on a row it had decoded, and the error
escaped the round: no entry of the claimed batch was sent or marked, and after the lease the
same batch was claimed and failed again, so one inserted row stopped the relay for every
entry. ``urllib.parse.urlsplit`` raises ``ValueError`` for a bracket it cannot read as an
IPv6 host (``https://[``, ``https://w.run.app]/x``) in the URL or the audience; a number in
the ``audience`` or ``service_account`` field (a Firestore document holds any type) made
the refusal's message raise ``TypeError``. Such a row must be marked failed with the
reason, and the rest sent."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import Relay, open_outbox, relay_producer
from tasklease.outbox.destinations import Destinations
from tasklease.outbox.entries import PENDING, TABLE, Entry, Undecodable, decode
from tasklease.producer import task_id
from tasklease.producer.transport import TaskRequest
from tests.support.outbox import QUEUE_PATH, producer, relay_env, sqlite_app_db, task_names

ACCOUNT = "invoker@p.iam.gserviceaccount.com"
UNSPLITTABLE = ("https://[", "https://w.run.app]/tasks/x", "https://[w.run.app]/tasks/x")


@pytest.mark.parametrize("url", UNSPLITTABLE)
def test_a_url_that_cannot_be_split_is_a_refusal(url: str) -> None:
    allowed = Destinations.configured("https://w.run.app")
    request = TaskRequest(QUEUE_PATH, "t", url, b"{}")
    reason = allowed.refusal(request)
    assert reason is not None and reason.startswith("refused to send to URL")


@pytest.mark.parametrize(
    ("column", "value"),
    [("url", "https://["), ("audience", "https://[")],
)
def test_one_unreadable_row_does_not_stop_the_others(
    tmp_path: Path, tasks: CloudTasksEmulator, column: str, value: object
) -> None:
    path = tmp_path / "app.db"
    url = sqlite_app_db(path)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("BEGIN")
        make = producer(tasks.url)
        items: list[tuple[str, Any]] = [(key, {}) for key in ("first", "bad", "last")]
        results = make.enqueue_many("x", items, transaction=conn)
        conn.execute(  # A token is asked for, so the audience is checked.
            f"UPDATE {TABLE} SET service_account = ? WHERE id = ?", (ACCOUNT, results[1].name)
        )
        conn.execute(f"UPDATE {TABLE} SET {column} = ? WHERE id = ?", (value, results[1].name))
        conn.commit()
    db = open_outbox(url)
    try:
        env = {**relay_env(tasks.url), "TASKLEASE_SERVICE_ACCOUNT": ACCOUNT}
        done = Relay(db, relay_producer(env)).drain()
        status = db.status(10**10)
    finally:
        db.close()
    assert task_names(tasks) == sorted(task_id("x", key) for key in ("first", "last"))
    assert (done.sent, done.failed, status.depth) == (2, 1, 0)
    assert [failed.id for failed in status.failed] == [results[1].name]


@pytest.mark.parametrize("field", ["audience", "service_account"])
def test_a_row_with_a_number_for_a_text_field_is_undecodable(field: str) -> None:
    request = TaskRequest(QUEUE_PATH, "t", "https://w.run.app/tasks/x", b"{}")
    row = {
        **Entry("x", request, created_at=0.0).row(),
        "state": PENDING,
        "attempts": 0,
        "last_error": None,
        "sent_at": None,
        field: 5,
    }
    decoded = decode(row)
    assert isinstance(decoded, Undecodable)
    assert field in decoded.reason


def test_a_number_for_an_audience_or_account_is_a_refusal() -> None:
    allowed = Destinations.configured("https://w.run.app", service_account=ACCOUNT)
    url = "https://w.run.app/tasks/x"
    number: Any = 5  # What a Firestore document may hold where text belongs.
    for request in (
        TaskRequest(QUEUE_PATH, "t", url, b"{}", service_account=ACCOUNT, audience=number),
        TaskRequest(QUEUE_PATH, "t", url, b"{}", service_account=number),
    ):
        reason = allowed.refusal(request)
        assert reason is not None and reason.startswith("refused to send with a token")
