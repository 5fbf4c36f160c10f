"""The SQLite store's files hold payloads and errors: only their owner may read them."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from tasklease.worker import constants as c
from tasklease.worker.stores import SqliteStore
from tests.helpers import T0, claim_request


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(params=[0o000, 0o022, 0o002])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def test_database_wal_and_shm_files_are_0600_and_new_folders_0700_whatever_the_umask(
    tmp_path: Path, umask: int
) -> None:
    path = tmp_path / "made" / "by" / "store" / "runs.db"
    store = SqliteStore(path)
    store.claim(claim_request(), T0)
    try:
        for name in ("runs.db", "runs.db-wal", "runs.db-shm"):
            assert mode(path.parent / name) == 0o600, name
        for folder in (tmp_path / "made", tmp_path / "made" / "by", path.parent):
            assert mode(folder) == 0o700, folder
    finally:
        store.close()


def test_an_existing_folder_keeps_its_mode(tmp_path: Path, umask: int) -> None:
    tmp_path.chmod(0o755)
    store = SqliteStore(tmp_path / "runs.db")
    store.get("anything")
    store.close()
    assert mode(tmp_path) == 0o755
    assert mode(tmp_path / "runs.db") == 0o600


def test_stored_error_text_is_capped(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    store.claim(claim_request(), T0)
    store.fail("run-1", "attempt-1", "x" * 100_000, T0 + timedelta(seconds=1), "{}")
    record = store.get("run-1")
    store.close()
    assert record is not None and record.error is not None
    assert len(record.error) <= c.MAX_ERROR_CHARS


def test_the_emulators_data_files_and_signing_key_are_owner_only(
    tmp_path: Path, umask: int
) -> None:
    from tasklease.emulator import CloudTasksEmulator  # noqa: PLC0415 - only this test needs it.

    data = tmp_path / "emulator"
    with CloudTasksEmulator(data_dir=data):
        pass
    assert mode(data) == 0o700
    for name in ("emulator.db", "oidc-key.pem"):
        assert mode(data / name) == 0o600, name
