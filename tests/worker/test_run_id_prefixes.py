"""A run is named by any unique prefix of its id of 8 characters or more (log lines print
12), in `runs show/release/replay` and the dashboard's URLs; an ambiguous one lists them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tasklease import cli
from tasklease.cli.runs import Exit
from tasklease.worker.dashboard import create_dashboard_app
from tasklease.worker.stores import SqliteStore
from tests.support.helpers import claim_request

ONE = "f386fa4e4288" + "a" * 52
TWIN_A = "0badc0de11" + "1" * 54
TWIN_B = "0badc0de22" + "2" * 54


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite store with a failed run ``ONE`` and two runs sharing 8 characters."""
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    now = datetime.now(UTC) - timedelta(minutes=5)
    for run_id in (ONE, TWIN_A, TWIN_B):
        store.claim(claim_request(run_id, identity={"queue": "q", "task_name": run_id}), now)
    store.fail(ONE, "attempt-1", "PermanentFailure: bad", now, '{"order": 7}')
    store.close()
    return f"sqlite:///{path}"


def test_runs_show_takes_the_twelve_characters_a_log_line_prints(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["runs", "show", ONE[:12], "--store", url]) == Exit.OK
    assert f"run_id             {ONE}" in capsys.readouterr().out
    assert cli.main(["runs", "show", ONE[:8], "--store", url]) == Exit.OK


def test_release_and_replay_take_a_prefix_too(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["runs", "release", ONE[:10], "--store", url]) == Exit.REFUSED
    assert f"run {ONE}: refused: the run is finished (failed)" in capsys.readouterr().err
    assert cli.main(["runs", "replay", TWIN_A[:12], "--store", url]) == Exit.REFUSED
    assert f"run {TWIN_A}: only failed" in capsys.readouterr().err


def test_an_ambiguous_prefix_is_an_error_listing_the_runs_it_matches(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["runs", "show", "0badc0de", "--store", url]) == Exit.USAGE
    err = capsys.readouterr().err
    assert "run id prefix '0badc0de' matches several runs" in err
    assert TWIN_A in err and TWIN_B in err


def test_a_prefix_shorter_than_eight_characters_names_no_run(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["runs", "show", ONE[:7], "--store", url]) == Exit.NOT_FOUND


def test_the_dashboard_redirects_a_prefix_to_the_runs_page(url: str) -> None:
    client = create_dashboard_app(SqliteStore(url.removeprefix("sqlite:///"))).test_client()
    moved = client.get(f"/runs/{ONE[:12]}")
    assert moved.status_code == 303
    assert moved.headers["Location"].endswith(f"/runs/{ONE}")
    assert client.get(f"/runs/{ONE[:12]}", follow_redirects=True).status_code == 200
    assert (
        client.get(f"/runs/{ONE[:12]}/replay").headers["Location"].endswith(f"/runs/{ONE}/replay")
    )
    ambiguous = client.get("/runs/0badc0de")
    assert ambiguous.status_code == 400
    assert TWIN_A in ambiguous.text and TWIN_B in ambiguous.text
