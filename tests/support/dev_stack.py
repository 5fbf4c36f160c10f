"""`tasklease dev` as a real process in a temp directory (a user's project, the stack driven
and stopped), and the processes it leaves."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tasklease.plumbing.serve import free_port

TASKLEASE = Path(sys.executable).parent / "tasklease"


def dev_flags() -> list[str]:
    """Free ports for every server `tasklease dev` starts."""
    rest = free_port()
    return [
        "--port", str(rest),
        "--grpc-port", str(free_port()),
        "--worker-port", str(free_port()),
        "--dashboard-port", str(free_port()),
        "--workers", "1",
    ]  # fmt: skip


def start_dev(
    cwd: Path, argv: Sequence[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """`tasklease dev ARGV` in ``cwd``, its output in one pipe; the marker its processes carry
    in their environment (for :func:`processes_with`)."""
    marker = uuid.uuid4().hex
    process = subprocess.Popen(
        [str(TASKLEASE), "dev", *argv],
        cwd=cwd,
        env={
            **os.environ,
            "TASKLEASE_TEST_MARKER": marker,
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # Its own process group, as a shell's foreground job.
    )
    return process, marker


def ctrl_c(process: subprocess.Popen[str]) -> None:
    """What Ctrl-C in a terminal does: SIGINT to every process of the foreground group."""
    os.killpg(process.pid, signal.SIGINT)


def kill_all(marker: str) -> None:
    """SIGKILL whatever still carries ``marker``: a test's cleanup after a failure."""
    for pid in processes_with(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def read_until(process: subprocess.Popen[str], wanted: str, timeout: float = 60) -> str:
    """What ``process`` printed up to and including the line holding ``wanted``."""
    assert process.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if wanted in line:
            return "".join(seen)
    raise AssertionError(f"no {wanted!r} in:\n{''.join(seen)}")


def processes_with(marker: str) -> list[int]:
    """Pids of live processes whose environment holds ``marker`` (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in environ and state != "Z":
            found.append(int(entry.name))
    return found


def wait_gone(marker: str, timeout: float = 20) -> list[int]:
    """Wait for every process carrying ``marker`` to end; those still alive."""
    deadline = time.monotonic() + timeout
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def write_project(root: Path, tasks_source: str) -> Path:
    """A user's project in ``root``: ``myshop/tasks.py`` holding ``tasks_source`` (its
    ``router``), and a tasklease.toml naming that router."""
    (root / "myshop").mkdir()
    (root / "myshop" / "__init__.py").write_text("")
    (root / "myshop" / "tasks.py").write_text(tasks_source)
    (root / "tasklease.toml").write_text('[worker]\nrouter = "myshop.tasks:router"\n')
    return root


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

    def stop(self) -> None:
        """Ctrl-C if it still runs, and check that every process it started is gone (those
        left are killed either way)."""
        try:
            if self.process.poll() is None:
                self.interrupt()
            assert wait_gone(self.marker) == []
        finally:
            kill_all(self.marker)
