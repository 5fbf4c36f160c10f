"""Finding: a header value that is not text (``headers={"X-Tags": ["a", "b"]}``) passed the
producer's checks, so ``enqueue(..., transaction=tx)`` staged it; the relay's client library
then raised ``TypeError`` building the request, which escaped the whole round. The entry was
never marked, so every round claimed it again (it is the oldest) and failed again: no entry
of the outbox was relayed any more. Such headers are refused at enqueue time, and an entry the
client cannot build (staged before that check, or written by hand) is marked failed with the
reason while the rest of its batch is sent."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import Relay, open_outbox, relay_producer
from tasklease.producer import InvalidTask, task_id
from tests.support.outbox import producer, relay_env, sqlite_app_db, task_names


@pytest.mark.parametrize("value", [["a", "b"], {"a": "b"}, 5, None])
def test_a_header_value_that_is_not_text_is_refused_before_anything_is_staged(
    tmp_path: Path, value: object
) -> None:
    sqlite_app_db(tmp_path / "app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("BEGIN")
    with pytest.raises(InvalidTask, match="X-Tags"):
        producer("http://127.0.0.1:9").enqueue(
            "x",
            {},
            key="k",
            headers={"X-Tags": value},  # type: ignore[dict-item]  # Not text, on purpose.
            transaction=conn,
        )
    assert conn.execute("SELECT COUNT(*) FROM tasklease_outbox").fetchone() == (0,)
    conn.rollback()


def test_an_entry_the_client_cannot_build_is_failed_and_the_rest_of_its_batch_is_sent(
    tmp_path: Path, tasks: CloudTasksEmulator
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("BEGIN")
    producer(tasks.url).enqueue_many("x", [("poison", {}), ("good", {})], transaction=conn)
    conn.commit()
    # As an entry staged before headers were checked (or written by hand) holds it.
    conn.execute(
        "UPDATE tasklease_outbox SET headers = ? WHERE task_id = ?",
        ('{"Content-Type":"application/json","X-Tags":["a","b"]}', task_id("x", "poison")),
    )
    conn.commit()
    conn.close()
    db = open_outbox(url)
    try:
        done = Relay(db, relay_producer(relay_env(tasks.url))).drain()
        status = db.status(10**10)
    finally:
        db.close()
    assert (done.sent, done.failed) == (1, 1)
    assert task_names(tasks) == [task_id("x", "good")]
    assert status.depth == 0
    assert [failed.id.rsplit("/", 1)[1] for failed in status.failed] == [task_id("x", "poison")]
    assert "TypeError" in status.failed[0].reason
