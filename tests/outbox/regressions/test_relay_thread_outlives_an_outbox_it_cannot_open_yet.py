"""Finding: ``RelayThread`` (the following relay an app starts, and ``tasklease dev``'s)
opened its outbox once, on its thread: when the database could not be opened at that moment
(a database still starting, a volume not mounted yet), the thread died with the error and the
process relayed nothing for the rest of its life, with no sign but one traceback. It tries
again every ``poll`` seconds until the outbox opens, then relays."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import RelayThread, relay_producer
from tasklease.producer import task_id
from tests.support.outbox import producer, relay_env, sqlite_app_db, task_names


def test_a_relay_thread_started_before_its_database_can_be_opened_relays_once_it_can(
    tmp_path: Path, tasks: CloudTasksEmulator
) -> None:
    path = tmp_path / "not-mounted-yet" / "app.db"
    env = relay_env(tasks.url)
    with RelayThread(f"sqlite:///{path}", relay_producer(env), poll=0.2):
        time.sleep(0.5)  # A few tries that cannot open it.
        path.parent.mkdir()
        sqlite_app_db(path)
        conn = sqlite3.connect(path)
        conn.execute("BEGIN")
        producer(tasks.url).enqueue("send_receipt", {}, key="late", transaction=conn)
        conn.commit()
        conn.close()
        name = task_id("send_receipt", "late")
        deadline = time.monotonic() + 20
        while name not in task_names(tasks) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert name in task_names(tasks)
