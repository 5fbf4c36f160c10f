"""`tasklease dev` as a real process in a temp directory, and the processes it leaves."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

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
