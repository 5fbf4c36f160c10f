"""Finding: ``tasklease outbox`` answered a mistyped dialect or a database it cannot open with
a Python traceback (``ValueError`` from the DDL, ``psycopg.OperationalError``,
``sqlite3.OperationalError``) instead of a one-line error and exit code 2, as it does for a
missing file or table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasklease.cli import main
from tasklease.plumbing.serve import free_port


@pytest.mark.parametrize("command", ["migrate", "status", "relay"])
def test_an_unreachable_postgres_outbox_is_a_one_line_error(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKLEASE_WORKER_URL", "http://127.0.0.1:9")  # The relay needs it.
    url = f"postgresql://127.0.0.1:{free_port()}/shop?connect_timeout=2"  # Nothing listens.
    assert main(["outbox", command, "--url", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tasklease outbox: cannot open the outbox") and "Traceback" not in err


def test_a_sqlite_outbox_in_a_missing_folder_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/no-such-folder/app.db"
    assert main(["outbox", "migrate", "--url", url]) == 2
    assert capsys.readouterr().err.startswith("tasklease outbox: cannot open the outbox")


def test_an_unknown_dialect_to_print_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["outbox", "migrate", "--print", "mysql"]) == 2
    assert "no outbox DDL for 'mysql'" in capsys.readouterr().err
