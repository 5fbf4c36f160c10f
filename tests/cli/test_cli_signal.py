"""``tasklease runs signal``: a signal from the command line, and ``runs show``'s wait."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease import cli, protocol
from tasklease.cli.runs import Exit
from tasklease.producer import Producer
from tasklease.producer.memory import MemoryTransport
from tasklease.testing.contract_support import claim_request
from tasklease.worker.core.waits import Wait
from tasklease.worker.stores import SqliteStore

RUN = "a" * 64


@pytest.fixture
def waiting(tmp_path: Path) -> str:
    """A SQLite store with run ``RUN`` waiting for ``approval``, and one completed run."""
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    now = datetime.now(UTC)
    request = claim_request(RUN, identity={"queue": "default", "task_name": "t-wait"})
    store.claim(request, now)
    wait = Wait("approval", 0, now, now + timedelta(hours=1), queue="default")
    assert store.suspend(RUN, "attempt-1", wait, '{"order": 7}', now) is not None
    store.claim(claim_request("done", identity={"queue": "default", "task_name": "t-d"}), now)
    assert store.complete("done", "attempt-1", None, now)
    store.close()
    return f"sqlite:///{path}"


@pytest.fixture
def queue(monkeypatch: pytest.MonkeyPatch) -> MemoryTransport:
    transport = MemoryTransport()

    def producer(**overrides: Any) -> Producer:
        return Producer("p", "l", "default", "https://w.example", transport=transport)

    monkeypatch.setattr(Producer, "from_env", producer)
    return transport


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_signal_enqueues_the_resume_once_and_says_so(
    waiting: str, queue: MemoryTransport, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    payload = tmp_path / "decision.json"
    payload.write_text('{"approved": true}')
    argv = ("runs", "signal", RUN[:8], "approval", "--payload", str(payload), "--store", waiting)
    code, out, _ = run(capsys, *argv, "--json")
    assert code == Exit.OK
    assert json.loads(out) == {
        "run_id": RUN,
        "signal": "approval",
        "outcome": "resumes",
        "accepted": True,
        "resume_enqueued": True,
    }
    (task,) = queue.tasks
    assert task.request.headers[protocol.RESUME_HEADER] == f"{RUN}:0:signal:approval"
    code, out, _ = run(capsys, *argv)
    assert code == Exit.OK and "sent before" in out
    assert len(queue.tasks) == 1  # The same name again: Cloud Tasks creates it once.
    code, out, _ = run(capsys, "runs", "show", RUN, "--store", waiting, "--json")
    shown = json.loads(out)["waits"]
    assert shown["wait"]["name"] == "approval" and shown["wait"]["signalled"] is True
    assert [s["name"] for s in shown["pending_signals"]] == ["approval"]
    code, out, _ = run(capsys, "runs", "show", RUN, "--store", waiting)
    assert "waits for" in out and "'approval'" in out


def test_a_signal_to_an_ended_or_unknown_run_is_refused(
    waiting: str, queue: MemoryTransport, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "runs", "signal", "done", "approval", "--store", waiting)
    assert code == Exit.REFUSED and "ended" in out
    code, _, err = run(capsys, "runs", "signal", "f" * 64, "approval", "--store", waiting)
    assert code == Exit.NOT_FOUND and "no run" in err
    assert queue.tasks == []


def test_bad_input_is_refused_naming_the_fix(
    waiting: str, queue: MemoryTransport, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    argv = ("runs", "signal", RUN, "approval", "--store", waiting)
    code, _, err = run(capsys, *argv, "--payload", str(broken))
    assert code == Exit.USAGE and "broken.json" in err
    code, _, err = run(capsys, "runs", "signal", RUN, "x" * 201, "--store", waiting)
    assert code == Exit.USAGE and "at most 200" in err
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps("x" * 300_000))
    code, _, err = run(capsys, *argv, "--payload", str(huge))
    assert code == Exit.USAGE and "store it elsewhere" in err
    assert queue.tasks == []


def test_releasing_a_waiting_run_points_to_its_signal(
    waiting: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "runs", "release", RUN, "--store", waiting)
    assert code == Exit.REFUSED
    assert "waits for a signal" in out + err and "runs signal" in out + err
