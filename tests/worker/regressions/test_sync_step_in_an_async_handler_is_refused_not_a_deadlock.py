"""Finding: ``ctx.step(...)`` (the sync form) called from an ``async def`` handler wrote its
record from the handler loop's thread, although store calls are promised never to run on
the loop. On SQLite it deadlocked the process: another async handler's transactional
``ctx.astep`` held SQLite's write lock while its coroutine waited for the loop, and the loop
waited for that lock. Both deliveries hung for good (no answer, no timeout) and so did every
async handler of the process. The sync form is refused on a running loop, before its
function runs: async handlers use ``await ctx.astep(...)``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIO = """
import asyncio, json, sys, threading
from pathlib import Path
from tasklease import protocol
from tasklease.worker import Router, create_app
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import task_headers

router = Router()
inside = threading.Event()

@router.task("holder")
async def holder(payload, ctx):
    async def write(tx):  # Holds SQLite's write lock while it awaits on the loop.
        inside.set()
        await asyncio.sleep(0.5)
        return 1
    return await ctx.astep("write", write, transactional=True)

@router.task("stepper")
async def stepper(payload, ctx):
    while not inside.is_set():
        await asyncio.sleep(0.01)
    return ctx.step("sync", lambda: 2)  # The sync form, on the loop.

app = create_app(router, store=SqliteStore(Path(sys.argv[1])), auth="none")
answers = {}

def post(name):
    answer = app.test_client().post(
        f"/tasks/{name}", headers=task_headers(task=f"t-{name}"), data="{}"
    )
    answers[name] = [answer.status_code, answer.headers[protocol.OUTCOME_HEADER],
                     answer.get_json().get("message", "")]

threads = [threading.Thread(target=post, args=(n,), daemon=True) for n in ("holder", "stepper")]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(10)
print(json.dumps(answers), flush=True)
"""


def test_a_sync_step_in_an_async_handler_is_refused_and_every_delivery_answers(
    tmp_path: Path,
) -> None:
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    root = Path(__file__).resolve().parents[3]
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path / "runs.db")],
            cwd=root,
            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the deliveries never answered: the handler loop is deadlocked")
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert answers["holder"][:2] == [200, "processed"], answers
    assert answers["stepper"][:2] == [200, "failed"], answers  # A dead letter saying why.
    assert "ctx.astep" in answers["stepper"][2]
