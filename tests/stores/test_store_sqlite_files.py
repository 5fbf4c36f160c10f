"""The SQLite store's files hold payloads and errors: only their owner may read them."""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from tasklease.errors import ConfigurationError
from tasklease.worker.core import constants as c
from tasklease.worker.stores import SqliteStore
from tests.support.helpers import T0, claim_request


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


def planted_by_someone_else(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``path`` another user's file: chown it when we may, else be another user."""
    if os.geteuid() == 0:
        os.chown(path, 65534, -1)
    else:
        other = os.geteuid() + 1
        monkeypatch.setattr(os, "geteuid", lambda: other)


def test_a_dangling_link_where_the_database_goes_is_refused_and_nothing_is_made_through_it(
    tmp_path: Path,
) -> None:
    shared, elsewhere = tmp_path / "shared", tmp_path / "attacker"
    shared.mkdir()
    elsewhere.mkdir()
    (shared / "runs.db").symlink_to(elsewhere / "planted.db")
    store = SqliteStore(shared / "runs.db")
    with pytest.raises(ConfigurationError, match=r"runs\.db is a symbolic link .*planted\.db"):
        store.claim(claim_request(), T0)
    store.close()
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal", ".lock"])
def test_a_planted_file_others_may_read_is_refused_by_name(tmp_path: Path, suffix: str) -> None:
    store = SqliteStore(tmp_path / "runs.db", busy_timeout=timedelta(milliseconds=200))
    store.get("anything")  # A healthy store first: the file and its companions exist.
    store.close()
    planted = tmp_path / f"runs.db{suffix}"
    planted.touch()
    planted.chmod(0o666)
    reopened = SqliteStore(tmp_path / "runs.db", busy_timeout=timedelta(milliseconds=200))
    with pytest.raises(ConfigurationError, match=rf"runs\.db{suffix} has mode 0666"):
        reopened.claim(claim_request(), T0)
    reopened.close()


@pytest.mark.parametrize("name", ["runs.db", "runs.db-wal", "runs.db-shm"])
def test_a_file_that_belongs_to_someone_else_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    healthy = SqliteStore(tmp_path / "runs.db")
    healthy.get("anything")
    healthy.close()
    planted = tmp_path / name
    planted.touch()
    planted.chmod(0o600)
    planted_by_someone_else(planted, monkeypatch)
    store = SqliteStore(tmp_path / "runs.db")
    with pytest.raises(ConfigurationError, match=rf"{name} belongs to uid \d+, not to this"):
        store.get("run-1")
    store.close()


def test_a_lock_file_someone_else_holds_is_refused_instead_of_answering_503_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "runs.db.lock"
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(descriptor, fcntl.LOCK_EX)  # Held through another open file, for ever.
    try:
        planted_by_someone_else(lock, monkeypatch)
        store = SqliteStore(tmp_path / "runs.db", busy_timeout=timedelta(milliseconds=200))
        with pytest.raises(ConfigurationError, match=r"runs\.db\.lock belongs to uid"):
            store.claim(claim_request(), T0)
        store.close()
    finally:
        os.close(descriptor)


def test_the_emulator_refuses_planted_database_companions_and_signing_keys(
    tmp_path: Path,
) -> None:
    from tasklease.emulator import CloudTasksEmulator  # noqa: PLC0415 - only this test needs it.

    data = tmp_path / "emulator"
    with CloudTasksEmulator(data_dir=data):
        pass
    wal = data / "emulator.db-wal"
    wal.touch()
    wal.chmod(0o644)
    with pytest.raises(ConfigurationError, match=r"emulator\.db-wal has mode 0644"):
        CloudTasksEmulator(data_dir=data)
    wal.unlink()
    key = data / "oidc-key.pem"
    key.unlink()
    key.symlink_to(tmp_path / "attacker.pem")
    with pytest.raises(ConfigurationError, match=r"oidc-key\.pem is a symbolic link"):
        CloudTasksEmulator(data_dir=data)
