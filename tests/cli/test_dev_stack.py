"""`tasklease dev` as a new user runs it, as real processes in a temp project: Scheduler jobs
signed for the worker, the store the read commands find, the handler's own log lines, Ctrl-C."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.dev_stack import Dev, dev_flags, read_until, wait_gone, write_project

SHOP = """
import logging
import time

from tasklease import Router, TaskContext

VERSION = "v1"
router = Router()
log = logging.getLogger("myshop")


@router.scheduled("nightly")
def nightly(ctx: TaskContext) -> None:
    log.info("nightly ran")


@router.task("echo")
def echo(payload: dict, ctx: TaskContext) -> None:
    log.info("echo %s %s", VERSION, payload["n"])


@router.task("slow")
def slow(payload: dict, ctx: TaskContext) -> None:
    log.info("slow started")
    time.sleep(120)
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project: myshop/tasks.py and a tasklease.toml naming its router."""
    return write_project(tmp_path, SHOP)


@pytest.fixture
def dev_flags_extra() -> list[str]:
    """Flags a test adds to `tasklease dev` (override with parametrize)."""
    return []


@pytest.fixture
def dev(project: Path, dev_flags_extra: list[str]) -> Iterator[Dev]:
    """`tasklease dev` in ``project`` (router from tasklease.toml), a job with no account."""
    flags = dev_flags()
    worker = flags[flags.index("--worker-port") + 1]
    (project / "jobs.toml").write_text(
        '[[job]]\nname = "nightly"\nschedule = "0 3 * * *"\n'
        f'url = "http://127.0.0.1:{worker}/jobs/nightly"\n'
    )
    stack = Dev(project, flags, ["--scheduler-config", "jobs.toml", *dev_flags_extra])
    try:
        yield stack
    finally:
        stack.stop()


def test_a_job_naming_no_service_account_is_signed_for_the_dev_worker(dev: Dev) -> None:
    triggered = dev.tasklease("scheduler", "run", "nightly", "--emulator", dev.emulator)
    assert triggered.returncode == 0, triggered.stderr
    run = dev.wait_for_run("nightly", "completed")
    assert run["kind"] == "scheduler"
    dev.interrupt()
    assert wait_gone(dev.marker) == []


def test_runs_unknown_lists_deliveries_refused_for_a_misspelled_handler(dev: Dev) -> None:
    dev.enqueue("slwo", {"n": 1})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = dev.tasklease("runs", "unknown", "--json")
        if listed.returncode == 0 and json.loads(listed.stdout)["unknown"]:
            break
        time.sleep(0.2)
    (row,) = json.loads(listed.stdout)["unknown"]
    assert row["path"] == "/tasks/slwo" and row["refused"] >= 1
    table = dev.tasklease("runs", "unknown").stdout.splitlines()
    assert table[0].split() == ["PATH", "REFUSED", "LAST"]
    assert table[1].startswith("/tasks/slwo")
    output = read_until(dev.process, "known_handlers=")
    (warning,) = [line for line in output.splitlines() if "known_handlers=" in line]
    assert "WARNING" in warning and "task slwo" in warning and "slow" in warning


LINE = re.compile(r"^\d\d:\d\d:\d\d (INFO|WARNING|ERROR|CRITICAL) +\S")


def test_every_log_line_has_one_format_and_a_handlers_own_lines_name_its_run(
    dev: Dev,
) -> None:
    dev.enqueue("echo", {"n": 1})
    output = dev.banner + read_until(dev.process, "echo v1 1")
    logged = [line for line in output.splitlines() if line[:1].isdigit()]
    assert logged and all(LINE.match(line) for line in logged), logged
    assert not [line for line in output.splitlines() if line.startswith("[")]  # gunicorn's.
    (own,) = [line for line in logged if "echo v1 1" in line]
    assert re.fullmatch(r"\S+ INFO    echo v1 1  \[handler=echo run_id=[0-9a-f]{12}\]", own)


def test_ctrl_c_names_the_interrupted_executions_and_their_lapsing_leases(dev: Dev) -> None:
    dev.enqueue("slow", {"n": 1})
    read_until(dev.process, "slow started")
    (run,) = [r for r in dev.runs() if r["handler"] == "slow"]
    rest = dev.interrupt()
    assert "stopping: 1 execution interrupted" in rest
    assert f"run {run['run_id'][:12]} (task slow, attempt 1, fencing token 1)" in rest
    assert "its lease lapses at" in rest and "then a retry runs it again" in rest
    assert "Perhaps out of memory" not in rest and "SIGKILL" not in rest
    assert "Traceback" not in rest
    assert wait_gone(dev.marker) == []


@pytest.mark.parametrize("dev_flags_extra", [["--reload"]])
def test_reload_restarts_the_worker_when_the_code_changes(dev: Dev, project: Path) -> None:
    dev.enqueue("echo", {"n": 1})
    read_until(dev.process, "echo v1 1")
    tasks = project / "myshop" / "tasks.py"
    tasks.write_text(tasks.read_text().replace('VERSION = "v1"', 'VERSION = "v2"'))
    seen = ""
    for n in range(2, 200):
        dev.enqueue("echo", {"n": n})
        seen += read_until(dev.process, f" {n}  [handler=echo")
        if f"echo v2 {n}" in seen:
            break
    assert "echo v2" in seen
