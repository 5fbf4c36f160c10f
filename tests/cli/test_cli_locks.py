"""`tasklease locks ...`: list the locks and free one, with `tasklease runs`' conventions."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease import cli
from tasklease.cli.runs import Exit
from tasklease.worker.core.records import LockRequest
from tasklease.worker.stores import SqliteStore
from tests.support.helpers import claim_request

LIVE, SILENT, ENDED = "job///nightly", "job///weekly", "key///post/acct-\x1b]52;c;cHdu\x07"
LOCK_KEYS = {
    "name", "state", "busy_until", "holder_run_id", "holder_attempt_id", "holder_run_status",
    "fencing_token", "started_at", "lease_expires", "safety_expires", "next_start_at",
    "released_at",
}  # fmt: skip


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite store with a running holder's lock, a silent holder's and a finished one's
    (its release lost), as of now."""
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    now = datetime.now(UTC)
    hour = timedelta(hours=1)
    store.claim(claim_request("run-live", "a-live"), now)
    store.acquire_lock(LockRequest(LIVE, "run-live", "a-live", timedelta(minutes=5), hour), now)
    silent_start = now - timedelta(minutes=10)
    store.claim(claim_request("run-silent", "a-silent"), silent_start)
    request = LockRequest(SILENT, "run-silent", "a-silent", timedelta(minutes=1), hour)
    store.acquire_lock(request, silent_start)
    store.claim(claim_request("run-ended", "a-ended"), now - timedelta(minutes=1))
    request = LockRequest(ENDED, "run-ended", "a-ended", timedelta(minutes=5))
    store.acquire_lock(request, now - timedelta(minutes=1))
    assert store.complete("run-ended", "a-ended", None, now)
    store.close()
    return f"sqlite:///{path}"


def tasklease(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_shows_each_lock_and_what_it_does_now(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = tasklease(capsys, "locks", "list", "--store", url, "--json")
    assert code == Exit.OK
    listed = json.loads(out)["locks"]
    assert [lock["name"] for lock in listed] == [LIVE, ENDED, SILENT]
    for lock in listed:
        assert set(lock) == LOCK_KEYS
    states = {lock["name"]: (lock["state"], lock["holder_run_status"]) for lock in listed}
    assert states == {
        LIVE: ("held", "in_progress"),
        SILENT: ("silent", "in_progress"),
        ENDED: ("free", "completed"),  # Its holder's run ended: the next run takes it.
    }
    code, out, _ = tasklease(capsys, "locks", "list", "--store", url)
    assert code == Exit.OK
    assert out.splitlines()[0].split() == [
        "STATE",
        "UNTIL",
        "HOLDER",
        "RUN",
        "STARTED",
        "TOKEN",
        "NAME",
    ]
    assert (
        "\x1b" not in out and "\x07" not in out
    )  # A key from a payload cannot drive the terminal.
    assert "acct-\\x1b]52;c;cHdu\\x07" in out


def test_release_refuses_a_running_holder_and_says_how_to_force_it(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = tasklease(capsys, "locks", "release", LIVE, "--store", url)
    assert code == Exit.REFUSED
    assert "refused: its holder (run run-live, attempt a-live) is running" in err
    assert "--force" in err
    code, out, _ = tasklease(capsys, "locks", "list", "--store", url, "--json")
    assert json.loads(out)["locks"][0]["state"] == "held"


def test_forced_release_warns_frees_the_lock_and_is_logged(
    url: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="tasklease.operations"):
        code, out, err = tasklease(capsys, "locks", "release", LIVE, "--store", url, "--force")
    assert code == Exit.OK
    assert "released: the next run takes it" in out
    assert err.startswith("warning: released lock job///nightly while its holder")
    [logged] = [r for r in caplog.records if r.name == "tasklease.operations"]
    assert logged.levelno == logging.WARNING
    assert "run-live" in logged.getMessage() and "forced" in logged.getMessage()
    store = SqliteStore(url.removeprefix("sqlite:///"))
    lock = store.get_lock(LIVE)
    assert lock is not None
    assert lock.released


def test_release_of_a_silent_holder_needs_no_force_and_a_free_lock_is_left_alone(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = tasklease(capsys, "locks", "release", SILENT, "--store", url, "--json")
    assert code == Exit.OK
    answer: dict[str, Any] = json.loads(out)
    assert (answer["outcome"], answer["forced"]) == ("released", False)
    assert answer["lock"]["state"] == "free"
    code, out, _ = tasklease(capsys, "locks", "release", ENDED, "--store", url)
    assert code == Exit.OK
    assert "already free" in out


def test_an_unknown_lock_or_a_broken_store_has_its_exit_code(
    url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = tasklease(capsys, "locks", "release", "job///none", "--store", url)
    assert code == Exit.NOT_FOUND
    assert "no such lock" in err
    code, out, _ = tasklease(capsys, "locks", "list", "--store", "nope://x", "--json")
    assert code == Exit.FAILED
    assert json.loads(out)["exit_code"] == Exit.FAILED
