"""`tasklease runs ...`: tables, the --json schema, and exit codes scripts can use."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease import cli
from tasklease.cli.runs import Exit
from tasklease.producer import MemoryTransport, Producer
from tasklease.testing.operations_contract import seed_every_state
from tasklease.worker.core.records import RunRecord
from tasklease.worker.stores import SqliteStore

SUMMARY_KEYS = {
    "run_id", "kind", "handler", "status", "stuck", "attempts", "fencing_token", "attempt_id",
    "caller", "claimed_at", "lease_expires", "finished_at", "duration_seconds", "expire_at",
    "identity", "error", "result_bytes", "payload_bytes", "replay_of", "replayed_as",
    "cancelled_by", "cancelled_at",
}  # fmt: skip


@pytest.fixture
def seeded(tmp_path: Path) -> tuple[str, dict[str, RunRecord]]:
    """A SQLite store holding one run in every state, as of now."""
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    records = seed_every_state(store, datetime.now(UTC) - timedelta(hours=1))
    store.close()
    return f"sqlite:///{path}", records


def tasklease(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def as_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code, out, _ = tasklease(capsys, *argv, "--json")
    return code, json.loads(out)


def test_list_json_has_one_schema_for_every_run(
    seeded: tuple[str, dict[str, RunRecord]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, records = seeded
    code, page = as_json(capsys, "runs", "list", "--store", url)
    assert code == Exit.OK
    assert set(page) == {"runs", "cursor"}
    assert page["cursor"] is None
    assert page["runs"][0]["run_id"] == "live"
    for run in page["runs"]:
        assert set(run) == SUMMARY_KEYS
        assert run["claimed_at"].endswith("Z")
    by_id = {run["run_id"]: run for run in page["runs"]}
    assert by_id["stuck"]["stuck"] is True and by_id["live"]["stuck"] is False
    assert by_id["failed"]["payload_bytes"] == len('{"order":7}')
    assert by_id["completed"]["result_bytes"] == len('{"sent":true}')
    assert set(by_id) == set(records)


def test_list_filters_and_pages(
    seeded: tuple[str, dict[str, RunRecord]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = seeded

    def ids(*flags: str) -> list[str]:
        code, page = as_json(capsys, "runs", "list", "--store", url, *flags)
        assert code == Exit.OK
        return [run["run_id"] for run in page["runs"]]

    assert ids("--status", "failed") == ["failed"]
    assert ids("--status", "skipped") == ["skipped"]
    assert ids("--handler", "nightly") == ["manual", "skipped"]
    assert ids("--kind", "scheduler", "--manual") == ["manual"]
    assert ids("--older-than", "58m30s") == ["completed", "cancelled", "waiting", "stuck"]
    assert ids("--newer-than", "5m") == ["live"]
    code, first = as_json(capsys, "runs", "list", "--store", url, "--limit", "4")
    assert len(first["runs"]) == 4 and first["cursor"]
    rest = ids("--limit", "4", "--cursor", first["cursor"])
    assert len(rest) == 4  # Of nine runs: a third page holds the last.
    code, _, err = tasklease(capsys, "runs", "list", "--store", url, "--cursor", "junk")
    assert code == Exit.USAGE and "cursor" in err


def test_list_prints_a_table_for_people(
    seeded: tuple[str, dict[str, RunRecord]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = seeded
    code, out, _ = tasklease(capsys, "runs", "list", "--store", url, "--limit", "3")
    assert code == Exit.OK
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["STATUS", "KIND", "HANDLER"]
    assert lines[1].split()[0] == "in_progress" and lines[1].endswith("live")
    assert lines[-1].startswith("more: --cursor ")


def test_show_prints_a_run_and_answers_3_for_an_unknown_one(
    seeded: tuple[str, dict[str, RunRecord]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = seeded
    code, out, _ = tasklease(capsys, "runs", "show", "failed", "--store", url)
    assert code == Exit.OK
    assert "PermanentFailure: bad" in out and "fencing_token" in out
    assert "payload_bytes" in out and "identity.task_name" in out
    code, shown = as_json(capsys, "runs", "show", "t-failed", "--store", url)  # By task name.
    assert code == Exit.OK and shown["run_id"] == "failed"
    # And its joins and waits.
    assert set(shown) == SUMMARY_KEYS | {"steps", "continuation", "waits", "fan_ins"}
    code, shown = as_json(
        capsys, "runs", "show", "--job", "nightly", "--schedule-time", "2026-10-16T12:04:00Z",
        "--store", url,
    )  # fmt: skip
    assert code == Exit.OK and shown["run_id"] == "skipped"
    code, shown = as_json(capsys, "runs", "show", "--job", "nightly", "--store", url)
    assert shown["run_id"] == "manual"  # The newest.
    code, _, err = tasklease(capsys, "runs", "show", "--store", url)
    assert code == Exit.USAGE and "RUN_ID or --job" in err
    code, error = as_json(capsys, "runs", "show", "nope", "--store", url)
    assert code == Exit.NOT_FOUND == error["exit_code"] == 3
    assert "no run nope" in error["error"]


def test_release_refuses_a_live_lease_and_force_fences_the_holder(
    seeded: tuple[str, dict[str, RunRecord]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, records = seeded
    code, out, err = tasklease(capsys, "runs", "release", "live", "--store", url)
    assert code == Exit.REFUSED
    assert "lease is live until" in err and "--force" in err
    code, out, err = tasklease(capsys, "runs", "release", "live", "--store", url, "--force")
    assert code == Exit.OK
    assert "warning" in err and "released" in out
    store = SqliteStore(url.removeprefix("sqlite:///"))
    stored = store.get("live")
    assert stored is not None
    assert stored.status.value == "released"
    assert stored.fencing_token == records["live"].fencing_token + 1
    assert not store.complete("live", "attempt-1", None, datetime.now(UTC))
    store.close()
    code, result = as_json(capsys, "runs", "release", "stuck", "--store", url)
    assert code == Exit.OK
    assert (result["outcome"], result["forced"], result["run"]["status"]) == (
        "released",
        False,
        "released",
    )
    code, result = as_json(capsys, "runs", "release", "completed", "--store", url)
    assert (code, result["outcome"]) == (Exit.REFUSED, "finished")
    code, _, _ = tasklease(capsys, "runs", "release", "nope", "--store", url)
    assert code == Exit.NOT_FOUND


def test_stuck_exits_5_with_crashed_runs_and_late_jobs(
    seeded: tuple[str, dict[str, RunRecord]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url, _ = seeded
    jobs = tmp_path / "jobs.toml"
    jobs.write_text('[[job]]\nname = "nightly"\nschedule = "*/5 * * * *"\n')
    code, report = as_json(capsys, "runs", "stuck", "--store", url, "--schedules", str(jobs))
    assert code == Exit.STUCK
    assert [run["run_id"] for run in report["runs"]] == ["stuck"]
    [job] = report["jobs"]
    assert (job["name"], job["last_success"]) == ("nightly", None)  # Manual runs do not count.
    code, out, _ = tasklease(capsys, "runs", "stuck", "--store", url)
    assert code == Exit.STUCK and "lease expired" in out
    tasklease(capsys, "runs", "release", "stuck", "--store", url)
    code, out, _ = tasklease(capsys, "runs", "stuck", "--store", url)
    assert (code, out.strip()) == (Exit.OK, "nothing stuck: no expired lease")


def test_stuck_reads_the_projects_deploy_config_by_default(
    seeded: tuple[str, dict[str, RunRecord]],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, _ = seeded
    project = tmp_path / "project"
    project.mkdir()
    (project / "tasklease.toml").write_text('[[job]]\nname = "weekly"\nschedule = "0 0 * * 0"\n')
    monkeypatch.chdir(project)
    code, report = as_json(capsys, "runs", "stuck", "--store", url)
    assert code == Exit.STUCK
    assert [job["name"] for job in report["jobs"]] == ["weekly"]


def test_replay_enqueues_once_and_reports_json(
    seeded: tuple[str, dict[str, RunRecord]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, _ = seeded
    queue = MemoryTransport()
    made: list[dict[str, Any]] = []

    def producer(**overrides: Any) -> Producer:
        made.append(overrides)
        return Producer("p", "l", "q", "https://w.example", transport=queue)

    monkeypatch.setattr(Producer, "from_env", producer)
    argv = ("runs", "replay", "failed", "--store", url, "--queue", "other")
    code, first = as_json(capsys, *argv)
    assert code == Exit.OK
    assert set(first) == {
        "run_id", "replay_run_id", "task_name", "created", "outcome", "replayed_run_id",
        "replay_status", "corrected_payload",
    }  # fmt: skip
    assert (first["created"], first["outcome"], first["replayed_run_id"]) == (
        True,
        "enqueued",
        "failed",
    )
    code, second = as_json(capsys, *argv)
    assert (code, second["created"], second["outcome"], second["replay_run_id"]) == (
        Exit.OK,
        False,
        "pending",
        first["replay_run_id"],
    )
    code, text, _ = tasklease(capsys, *argv)
    assert (code, text.strip()) == (
        Exit.OK,
        f"run failed: Already replayed: pending as run {first['replay_run_id']} (released); "
        "nothing enqueued.",
    )
    assert len(queue.tasks) == 1
    assert made[0] == {"queue": "other"}
    code, error = as_json(capsys, "runs", "replay", "completed", "--store", url)
    assert code == Exit.REFUSED and "only failed" in error["error"]


def test_a_store_that_cannot_be_built_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = tasklease(capsys, "runs", "list", "--store", "bogus://x")
    assert code == Exit.FAILED and "unknown store URL" in err
