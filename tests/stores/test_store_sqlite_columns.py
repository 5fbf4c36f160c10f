"""SQLite: the replay-link columns are added to an existing file, whatever its version."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tasklease.worker.stores import SqliteStore
from tasklease.worker.stores.sqlite.schema import SCHEMA_VERSION
from tests.support.helpers import T0, claim_request


def test_a_file_without_replay_columns_gets_them_and_keeps_its_runs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    store.claim(claim_request(), T0)
    store.close()
    with sqlite3.connect(path) as connection:  # As a tasklease before the columns wrote it.
        connection.execute("ALTER TABLE runs DROP COLUMN replay_of")
        connection.execute("ALTER TABLE runs DROP COLUMN replayed_as")
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    connection.close()
    reopened = SqliteStore(path)
    assert reopened.mark_replayed("run-1", "run-2") is not None
    assert reopened.get("run-1").replayed_as == "run-2"  # type: ignore[union-attr]
    reopened.close()
    again = SqliteStore(path)  # Idempotent: opening once more adds nothing and fails nothing.
    assert again.get("run-1").replayed_as == "run-2"  # type: ignore[union-attr]
    again.close()
