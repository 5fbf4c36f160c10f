"""A dead letter's payload and result can be read (secrets masked by a configurable hook)
and replayed with a corrected payload, the replay's record saying so."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease import cli
from tasklease.cli.runs import Exit
from tasklease.producer import MemoryTransport, Producer
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.dashboard import create_dashboard_app
from tasklease.worker.stores import SqliteStore
from tests.support.helpers import claim_request

PAYLOAD = {"order": 7, "customer": {"email": "a@example.com", "card_number": "4111"}}


@pytest.fixture
def path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A SQLite store holding the dead letter ``dead`` of handler ``charge``."""
    monkeypatch.delenv("TASKLEASE_REDACT_KEYS", raising=False)
    monkeypatch.delenv("TASKLEASE_REDACTOR", raising=False)
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    at = datetime.now(UTC) - timedelta(minutes=5)
    request = claim_request("dead", handler="charge", identity={"queue": "q", "task_name": "t"})
    store.claim(request, at)
    store.fail("dead", "attempt-1", "PermanentFailure: no such order", at, json.dumps(PAYLOAD))
    store.close()
    return path


def show(path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    assert cli.main(["runs", "show", "dead", "--store", f"sqlite:///{path}", *flags]) == Exit.OK
    return capsys.readouterr().out


def test_show_payload_prints_it_with_card_numbers_masked_by_default(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = show(path, capsys, "--payload")
    assert '"order": 7' in out and '"email": "a@example.com"' in out
    assert '"card_number": "***"' in out and "4111" not in out
    assert "result:            (none)" in out
    shown = json.loads(show(path, capsys, "--payload", "--json"))
    assert shown["payload"]["customer"]["card_number"] == "***"
    assert "payload" not in json.loads(show(path, capsys, "--json"))  # Only when asked.


def test_the_masked_keys_and_a_redaction_function_are_configurable(
    path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "myredact.py").write_text(
        "def redact(value):\n"
        "    value['customer']['email'] = value['customer']['email'].split('@')[1]\n"
        "    return value\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TASKLEASE_REDACT_KEYS", "order")
    monkeypatch.setenv("TASKLEASE_REDACTOR", "myredact:redact")
    shown = json.loads(show(path, capsys, "--payload", "--json"))["payload"]
    assert shown == {"order": "***", "customer": {"email": "example.com", "card_number": "4111"}}


def test_the_dashboard_run_page_shows_the_payload_masked(path: Path) -> None:
    page = create_dashboard_app(SqliteStore(path)).test_client().get("/runs/dead").text
    assert 'id="payload"' in page and "&#34;order&#34;: 7" in page
    assert "4111" not in page


def test_replay_with_a_corrected_payload_sends_it_and_the_replay_records_it(
    path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = MemoryTransport()
    producer = Producer("p", "l", "q", "https://w.example", transport=queue)
    monkeypatch.setattr(Producer, "from_env", lambda **_: producer)
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps({"order": 8}))
    url = f"sqlite:///{path}"
    argv = ["runs", "replay", "dead", "--store", url, "--payload", str(fixed), "--json"]
    assert cli.main(argv) == Exit.OK
    replay = json.loads(capsys.readouterr().out)
    assert replay["corrected_payload"] is True and replay["outcome"] == "enqueued"

    received: list[Any] = []
    router = Router()

    @router.task("charge")
    def charge(payload: Any, ctx: TaskContext) -> None:
        received.append(payload)

    store = SqliteStore(path)
    client = create_app(router, store=store, auth="none").test_client()
    (task,) = queue.tasks
    assert queue.deliver(task, client.post, "q") == 200
    assert received == [{"order": 8}]
    record = store.get(replay["replay_run_id"])
    assert record is not None and record.status.value == "completed"
    assert record.identity["replay_payload"] == "corrected"
    assert record.replay_of == "dead"


def test_replay_with_an_unreadable_payload_file_is_a_usage_error(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    argv = ["runs", "replay", "dead", "--store", f"sqlite:///{path}", "--payload", str(broken)]
    assert cli.main(argv) == Exit.USAGE
    assert f"--payload {broken}" in capsys.readouterr().err
