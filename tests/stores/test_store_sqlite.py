from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasklease.errors import ConfigurationError, StoreUnavailable
from tasklease.testing.contract_support import lock_request
from tasklease.testing.fan_in_contract import FanInContract, FanInCrossProcess
from tasklease.testing.store_contract import (
    CrossProcessContract,
    LockContract,
    OperationsContract,
    StoreContract,
    TallyContract,
)
from tasklease.worker.core.records import RunStatus, Verdict
from tasklease.worker.stores import SqliteStore, store_from_url
from tests.support.helpers import T0, claim_request


class TestSqliteStore(
    StoreContract,
    LockContract,
    FanInContract,
    FanInCrossProcess,
    OperationsContract,
    CrossProcessContract,
    TallyContract,
):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[SqliteStore]:
        store = SqliteStore(tmp_path / "runs.db")
        yield store
        store.close()

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> functools.partial[SqliteStore]:
        return functools.partial(SqliteStore, tmp_path / "shared.db")


def test_completed_record_survives_reopening_the_file(tmp_path: Path) -> None:
    first = SqliteStore(tmp_path / "runs.db")
    first.claim(claim_request(), T0)
    first.complete("run-1", "attempt-1", '{"ok":1}', T0)
    first.close()
    claim = SqliteStore(tmp_path / "runs.db").claim(claim_request(attempt_id="attempt-2"), T0)
    assert claim.verdict is Verdict.COMPLETED
    assert claim.record.result == {"ok": 1}


def test_two_store_objects_on_one_file_see_each_others_claims(tmp_path: Path) -> None:
    one, two = SqliteStore(tmp_path / "runs.db"), SqliteStore(tmp_path / "runs.db")
    one.claim(claim_request(), T0)
    assert two.claim(claim_request(attempt_id="attempt-2"), T0).verdict is Verdict.IN_PROGRESS


def test_unreachable_file_raises_store_unavailable_and_recovers(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store wants a folder")
    store = SqliteStore(blocker / "runs.db")
    with pytest.raises(StoreUnavailable, match="could not"):
        store.claim(claim_request(), T0)
    blocker.unlink()
    assert store.claim(claim_request(), T0).verdict is Verdict.CLAIMED


def test_newer_schema_is_refused_with_a_message(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    sqlite3.connect(path).execute("PRAGMA user_version = 99").connection.close()
    path.chmod(0o600)  # sqlite3 made it 0644 less the umask: refused for that first.
    with pytest.raises(StoreUnavailable, match="upgrade tasklease"):
        SqliteStore(path).get("x")


def test_claims_purge_expired_records_now_and_then(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    store.claim(claim_request("old"), T0)
    store.complete("old", "attempt-1", None, T0)
    store._next_purge = 0.0  # The next claim is due to purge.
    store.claim(claim_request("new"), T0 + claim_request().retention + claim_request().lease)
    assert store.get("old") is None
    assert store.list_runs(RunStatus.IN_PROGRESS)[0].run_id == "new"


@pytest.mark.parametrize(
    ("url", "kind"),
    [("memory://", "MemoryStore"), ("sqlite:///runs.db", "SqliteStore")],
)
def test_store_url_picks_the_backend(url: str, kind: str) -> None:
    assert type(store_from_url(url)).__name__ == kind


def test_sqlite_url_keeps_absolute_paths(tmp_path: Path) -> None:
    store = store_from_url(f"sqlite:///{tmp_path}/x.db")
    assert isinstance(store, SqliteStore)
    assert store.path == tmp_path / "x.db"


def test_unknown_store_url_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="unknown store URL"):
        store_from_url("redis://localhost")


def test_a_version_2_file_gains_the_locks_table_and_keeps_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    _older_file(path, "DROP TABLE locks; PRAGMA user_version = 2;")
    store = SqliteStore(path)
    assert store.get("run-1") is not None
    assert store.acquire_lock(lock_request(), T0).acquired
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 3


def test_lookups_by_task_or_job_name_use_the_partial_indexes(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    SqliteStore(path).get("warm-up")  # Creates the file and its schema.
    connection = sqlite3.connect(path)
    for name, index in (("task_name", "runs_by_task"), ("job_name", "runs_by_job")):
        query = f"SELECT run_id FROM runs WHERE json_extract(identity, '$.{name}') = ?"
        plan = connection.execute(f"EXPLAIN QUERY PLAN {query}", ("x",)).fetchall()
        assert any(f"USING INDEX {index}" in row[-1] for row in plan), plan


def test_an_older_files_full_name_indexes_are_replaced_by_the_partial_ones(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    _older_file(
        path,
        "DROP INDEX runs_by_task; DROP INDEX runs_by_job;"
        "CREATE INDEX runs_by_task_name ON runs (json_extract(identity, '$.task_name'));"
        "CREATE INDEX runs_by_job_name ON runs (json_extract(identity, '$.job_name'));",
    )
    store = SqliteStore(path)
    assert [record.run_id for record in store.find_runs(task_name="t")] == ["run-1"]
    indexes = {row[0] for row in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    assert {"runs_by_task", "runs_by_job"} <= indexes
    assert not {"runs_by_task_name", "runs_by_job_name"} & indexes


def _older_file(path: Path, script: str) -> None:
    """A file with one claimed run, then changed by ``script`` into an older version's."""
    old = SqliteStore(path)
    old.claim(claim_request(), T0)
    old.close()
    connection = sqlite3.connect(path)
    connection.executescript(script)
    connection.close()
