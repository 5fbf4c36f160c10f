"""`tasklease runs cancel`: exit codes, --json, --by, and the cancellation shown by
`runs show` and listed by `runs list --status cancelled`."""

from __future__ import annotations

import getpass
import json

import pytest

from tasklease.cli.runs import Exit
from tasklease.worker.core.records import RunRecord
from tests.cli.test_cli_runs import as_json, seeded, tasklease

__all__ = ["seeded"]  # The fixture, shared with the other `runs` tests.


def test_cancel_a_released_run_then_show_and_list_it(
    seeded: tuple[str, dict[str, RunRecord]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = seeded
    code, out, _ = tasklease(capsys, "runs", "cancel", "released", "--by", "ops@x", "--store", url)
    assert code == Exit.OK and "run released: cancelled by ops@x at " in out
    code, shown = as_json(capsys, "runs", "show", "released", "--store", url)
    assert (shown["status"], shown["cancelled_by"]) == ("cancelled", "ops@x")
    assert shown["cancelled_at"].endswith("Z")
    code, out, _ = tasklease(capsys, "runs", "show", "released", "--store", url)
    assert "cancelled_by       ops@x" in out and "cancelled_at" in out
    code, page = as_json(capsys, "runs", "list", "--status", "cancelled", "--store", url)
    assert sorted(run["run_id"] for run in page["runs"]) == ["cancelled", "released"]
    code, again = as_json(capsys, "runs", "cancel", "released", "--store", url)
    assert code == Exit.OK and (again["outcome"], again["cancelled"]) == ("already", True)
    assert again["run"]["cancelled_by"] == "ops@x"  # The first cancellation's.


def test_cancel_a_running_run_marks_it_and_by_defaults_to_the_os_user(
    seeded: tuple[str, dict[str, RunRecord]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = seeded
    code, done = as_json(capsys, "runs", "cancel", "live", "--store", url)
    assert code == Exit.OK and (done["outcome"], done["cancelled"]) == ("stopping", True)
    assert done["run"]["status"] == "in_progress"
    assert done["run"]["cancelled_by"] == getpass.getuser()


def test_cancel_answers_4_for_an_ended_run_and_3_for_an_unknown_one(
    seeded: tuple[str, dict[str, RunRecord]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = seeded
    code, _, err = tasklease(capsys, "runs", "cancel", "completed", "--store", url)
    assert code == Exit.REFUSED and "not cancelled: it has ended (completed)" in err
    code, out, err = tasklease(capsys, "runs", "cancel", "nope", "--store", url, "--json")
    assert code == Exit.NOT_FOUND and "no run nope" in err
    assert json.loads(out) == {"error": "no run nope", "exit_code": 3}
    code, _, err = tasklease(capsys, "runs", "cancel", "failed", "--by", " ", "--store", url)
    assert code == Exit.USAGE and "--by: name who cancels" in err
