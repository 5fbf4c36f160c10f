"""Finding: the SQLite outbox (``tasklease outbox migrate --url sqlite:///...``, the relay,
the dashboard's page) created its file with mode 0644, readable by every local user, though
its entries hold task payloads; and it opened a symbolic link planted where the file should
be, writing its table wherever the link pointed. The SQLite store refuses both. An existing
file of this user (the application's database) keeps the mode the application chose."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasklease.cli import main
from tasklease.errors import ConfigurationError
from tasklease.outbox import open_outbox


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)  # The usual umask: what a plain open() makes is 0644.
    yield
    os.umask(previous)


def test_a_new_outbox_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    db = open_outbox(f"sqlite:///{path}")
    db.migrate()
    db.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_planted_symbolic_link_is_refused_and_its_target_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "elsewhere.db"
    target.touch(mode=0o600)
    link = tmp_path / "app.db"
    link.symlink_to(target)
    with pytest.raises(ConfigurationError, match="is a symbolic link"):
        open_outbox(f"sqlite:///{link}")
    assert main(["outbox", "migrate", "--url", f"sqlite:///{link}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tasklease outbox: {link} is a symbolic link") and err.count("\n") == 1
    assert target.stat().st_size == 0  # No table was written through the link.


def test_a_planted_journal_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "app.db"
    open_outbox(f"sqlite:///{path}").close()
    journal = tmp_path / "app.db-journal"  # SQLite would roll it back into the database.
    journal.touch(mode=0o600)
    if os.geteuid() == 0:
        os.chown(journal, 65534, -1)
    else:
        other = os.geteuid() + 1  # Be another user: the files are then someone else's.
        monkeypatch.setattr(os, "geteuid", lambda: other)
    with pytest.raises(ConfigurationError, match=r"app\.db-journal belongs to uid"):
        open_outbox(f"sqlite:///{path}")


def test_the_applications_own_database_is_used_with_the_mode_it_chose(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    sqlite3.connect(path).close()  # 0644, as Django or the app made it.
    db = open_outbox(f"sqlite:///{path}")
    db.migrate()
    db.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
