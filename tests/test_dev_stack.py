"""`tasklease dev` as a new user runs it, as real processes in a temp project: Scheduler jobs
signed for the worker, the store the read commands find, the handler's own log lines, Ctrl-C."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dev_stack import (
    TASKLEASE,
    ctrl_c,
    dev_flags,
    kill_all,
    read_until,
    start_dev,
    wait_gone,
)

SHOP = """
import logging
import time

from tasklease import Router, TaskContext

router = Router()
log = logging.getLogger("myshop")


@router.scheduled("nightly")
def nightly(ctx: TaskContext) -> None:
    log.info("nightly ran")


@router.task("slow")
def slow(payload: dict, ctx: TaskContext) -> None:
    log.info("slow started")
    time.sleep(120)
"""


class Dev:
    """A running `tasklease dev` and what it needs to be driven."""

    def __init__(self, project: Path, flags: list[str], extra: list[str]) -> None:
        self.project = project
        self.flags = flags
        self.process, self.marker = start_dev(project, [*flags, *extra])
        self.banner = read_until(self.process, "Dashboard (runs")

    def flag(self, name: str) -> str:
        return self.flags[self.flags.index(name) + 1]

    @property
    def emulator(self) -> str:
        return f"http://127.0.0.1:{self.flag('--port')}"

    def tasklease(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TASKLEASE), *argv],
            cwd=self.project,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def runs(self) -> list[dict[str, Any]]:
        listed = self.tasklease("runs", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        runs: list[dict[str, Any]] = json.loads(listed.stdout)["runs"]
        return runs

    def wait_for_run(self, handler: str, status: str) -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for run in self.runs():
                if run["handler"] == handler and run["status"] == status:
                    return run
            time.sleep(0.2)
        raise AssertionError(f"no {status} run of {handler}: {self.runs()}")

    def enqueue(self, handler: str, payload: dict[str, Any]) -> None:
        from tasklease.producer import Producer  # noqa: PLC0415

        worker = f"http://127.0.0.1:{self.flag('--worker-port')}"
        producer = Producer.from_env(
            {},
            project="dev-project",
            location="us-central1",
            queue="default",
            worker_url=worker,
            service_account="tasks@dev-project.iam.gserviceaccount.com",
            tasks_endpoint=self.emulator,
        )
        producer.enqueue(handler, payload)

    def interrupt(self) -> str:
        """Ctrl-C; what it printed from then on."""
        ctrl_c(self.process)
        rest, _ = self.process.communicate(timeout=60)
        return rest


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project: myshop/tasks.py and a tasklease.toml naming its router."""
    (tmp_path / "myshop").mkdir()
    (tmp_path / "myshop" / "__init__.py").write_text("")
    (tmp_path / "myshop" / "tasks.py").write_text(SHOP)
    (tmp_path / "tasklease.toml").write_text('[worker]\nrouter = "myshop.tasks:router"\n')
    return tmp_path


@pytest.fixture
def dev(project: Path) -> Iterator[Dev]:
    """`tasklease dev` in ``project`` (router from tasklease.toml), a job with no account."""
    flags = dev_flags()
    worker = flags[flags.index("--worker-port") + 1]
    (project / "jobs.toml").write_text(
        '[[job]]\nname = "nightly"\nschedule = "0 3 * * *"\n'
        f'url = "http://127.0.0.1:{worker}/jobs/nightly"\n'
    )
    stack = Dev(project, flags, ["--scheduler-config", "jobs.toml"])
    try:
        yield stack
    finally:
        try:
            if stack.process.poll() is None:
                stack.interrupt()
            assert wait_gone(stack.marker) == []
        finally:
            kill_all(stack.marker)


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
