"""Finding: ``tasklease runs``, ``locks`` and ``dashboard`` echoed the Postgres URL with its
password to stderr (even when it came from ``TASKLEASE_STORE``), the dashboard's banner
printed it, ``tasklease dev`` wrote it to ``.tasklease/store-url`` readable by every local
user (0644), and ``tasklease outbox relay --url`` kept it in the process's command line,
which every local user reads (``ps``)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasklease.cli import main
from tasklease.cli.store_choice import DEV_STORE_FILE, write_dev_store
from tasklease.plumbing.serve import free_port
from tests.support import postgres as postgres_support
from tests.support.dev_stack import TASKLEASE, read_until

PASSWORD = "Zq9-s3cret-pw"  # The cluster trusts every login: any password logs in.


@pytest.fixture
def store_url(postgres_cluster: postgres_support.Cluster) -> str:
    url = postgres_cluster.url(schema=postgres_support.fresh_schema())
    return url.replace("postgres@", f"postgres:{PASSWORD}@", 1)


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)  # The usual umask: what a plain open() makes is 0644.
    yield
    os.umask(previous)


@pytest.mark.parametrize("command", [["runs", "list"], ["locks", "list"]])
def test_a_read_command_names_the_store_without_its_password(
    command: list[str],
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TASKLEASE_STORE", store_url)
    assert main(command) == 0
    out, err = capsys.readouterr()
    assert PASSWORD not in out + err
    assert "store: postgresql://postgres:***@127.0.0.1" in err


def test_the_dashboards_banner_names_the_store_without_its_password(
    store_url: str, tmp_path: Path
) -> None:
    dashboard = subprocess.Popen(
        [str(TASKLEASE), "dashboard", "--port", str(free_port())],
        cwd=tmp_path,
        env={**os.environ, "TASKLEASE_STORE": store_url, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        shown = read_until(dashboard, "tasklease dashboard on")
    finally:
        dashboard.send_signal(signal.SIGTERM)
        rest, _ = dashboard.communicate(timeout=30)
    assert PASSWORD not in shown + rest
    assert "(store: postgresql://postgres:***@127.0.0.1" in shown


def test_the_dev_store_file_is_readable_by_its_owner_only(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask_022: None
) -> None:
    monkeypatch.chdir(tmp_path)
    write_dev_store(store_url)
    assert stat.S_IMODE(DEV_STORE_FILE.stat().st_mode) == 0o600
    assert DEV_STORE_FILE.read_text(encoding="utf-8") == store_url + "\n"


def test_the_dev_store_file_replaces_a_planted_link_without_writing_through_it(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask_022: None
) -> None:
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "someone-elses-file"
    target.write_text("theirs\n", encoding="utf-8")
    DEV_STORE_FILE.parent.mkdir()
    DEV_STORE_FILE.symlink_to(target)
    write_dev_store(store_url)
    assert target.read_text(encoding="utf-8") == "theirs\n"
    assert not DEV_STORE_FILE.is_symlink()
    assert stat.S_IMODE(DEV_STORE_FILE.stat().st_mode) == 0o600


@pytest.mark.parametrize("command", ["relay", "migrate", "status"])
def test_an_outbox_url_with_a_password_is_refused_on_the_command_line(
    command: str, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["outbox", command, "--url", store_url]) == 2
    err = capsys.readouterr().err
    assert PASSWORD not in err
    assert err.count("\n") == 1
    assert "TASKLEASE_OUTBOX_URL" in err and "--url-file PATH" in err


def test_the_outbox_url_is_read_from_the_file_url_file_names(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url_file = tmp_path / "outbox-url"
    url_file.write_text(store_url + "\n", encoding="utf-8")
    assert main(["outbox", "migrate", "--url-file", str(url_file)]) == 0
    assert main(["outbox", "status", "--url-file", str(url_file)]) == 0
    out, err = capsys.readouterr()
    assert "tasklease_outbox ready in postgresql://postgres:***@" in out
    assert "pending 0" in out
    assert PASSWORD not in out + err


def test_a_missing_url_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-file"
    assert main(["outbox", "relay", "--url-file", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == f"tasklease outbox: --url-file {missing}: No such file or directory\n"


def test_an_empty_url_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "outbox-url"
    empty.write_text("\n", encoding="utf-8")
    assert main(["outbox", "relay", "--url-file", str(empty)]) == 2
    assert capsys.readouterr().err == f"tasklease outbox: --url-file {empty} is empty\n"
