"""Which store `runs`, `locks` and `dashboard` read: never a new empty one, the dev stack's
when nothing else names one, and a line saying which."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tasklease import cli
from tasklease.cli.store_choice import DEV_STORE_FILE, write_dev_store
from tasklease.testing.operations_contract import seed_every_state
from tasklease.worker.stores import SqliteStore


@pytest.fixture
def empty_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory with no store in it and no TASKLEASE_STORE."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TASKLEASE_STORE", raising=False)
    return tmp_path


@pytest.mark.parametrize(
    "command", [["runs", "list"], ["runs", "show", "abcdefgh"], ["locks", "list"], ["dashboard"]]
)
def test_a_read_command_on_a_missing_sqlite_file_fails_naming_it_and_creates_nothing(
    command: list[str], empty_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main([*command, "--port", "0"] if command == ["dashboard"] else command)
    err = capsys.readouterr().err
    assert code == 1
    assert "no store at tasklease-runs.db" in err and "nothing created" in err
    assert list(empty_dir.iterdir()) == []


def test_a_store_flag_naming_a_missing_file_creates_nothing_either(
    empty_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = empty_dir / "elsewhere" / "runs.db"
    assert cli.main(["runs", "list", "--store", f"sqlite:///{missing}"]) == 1
    assert f"no store at {missing} (--store)" in capsys.readouterr().err
    assert list(empty_dir.iterdir()) == []


def test_runs_reads_the_store_the_dev_stack_wrote_down_and_says_so(
    empty_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = write_dev_store("sqlite:///.tasklease/runs.db")
    assert url == f"sqlite:///{empty_dir / '.tasklease' / 'runs.db'}"
    store = SqliteStore(empty_dir / ".tasklease" / "runs.db")
    seed_every_state(store, datetime.now(UTC) - timedelta(hours=1))
    store.close()
    assert cli.main(["runs", "list"]) == 0
    captured = capsys.readouterr()
    assert "failed" in captured.out and "no runs" not in captured.out
    assert captured.err == f"store: {url} (the one `tasklease dev` uses ({DEV_STORE_FILE}))\n"


def test_tasklease_store_wins_over_the_dev_stacks_file(
    empty_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_dev_store("sqlite:///.tasklease/runs.db")
    monkeypatch.setenv("TASKLEASE_STORE", "memory://")
    assert cli.main(["runs", "list"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "no runs\n"
    assert captured.err == "store: memory:// ($TASKLEASE_STORE)\n"
