"""`make demo` says what it installs while it installs, one line a step, with pip's chatter held
back unless pip fails. Run against a stand-in Python whose venv and pip only print, so the
Makefile's own recipe is what is tested, in a second."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A python3 that makes a "venv" whose python fakes pip and whose tasklease fakes the demo.
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  cp "$0.venv-python" "$3/bin/python" && cp "$0.tasklease" "$3/bin/tasklease"
fi
"""
FAKE_VENV_PYTHON = """#!/bin/sh
echo "WARNING: a location pip ignores" >&2
case "$*" in *upgrade*) exit 0 ;; esac
if [ -n "$FAIL_PIP" ]; then echo "ERROR: no matching distribution" >&2; exit 1; fi
echo "Obtaining file:///somewhere"
echo "Collecting flask>=3.0"
echo "  Downloading flask-3.1.0-py3-none-any.whl"
echo "Collecting werkzeug>=3.0"
echo "Successfully installed flask-3.1.0 tasklease-0.1.0 werkzeug-3.1.0"
"""


def make_demo(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "python3"
    for path, text in ((fake, FAKE_PYTHON), (Path(f"{fake}.venv-python"), FAKE_VENV_PYTHON)):
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    tasklease = Path(f"{fake}.tasklease")
    tasklease.write_text('#!/bin/sh\necho "the demo ran: $*"\n')
    tasklease.chmod(0o755)
    return subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-C",
            ROOT,
            "demo",
            f"PYTHON={fake}",
            f"VENV={tmp_path / 'venv'}",
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def test_make_demo_names_each_install_step_and_sums_up_pip_in_a_line(tmp_path: Path) -> None:
    done = make_demo(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line for line in lines if line.startswith("==>")] == [
        f"==> creating the virtual environment {tmp_path / 'venv'}",
        "==> upgrading pip",
        f"==> installing tasklease and its development tools into {tmp_path / 'venv'}",
        "==> running the demo",
    ]
    assert "    3 packages checked, 3 installed" in [line.rstrip() for line in lines]
    assert "the demo ran: demo" in lines
    assert "WARNING" not in done.stdout + done.stderr
    assert "Downloading" not in done.stdout


def test_a_failing_install_shows_what_pip_said_and_stops(tmp_path: Path) -> None:
    done = make_demo(tmp_path, FAIL_PIP="1")
    assert done.returncode != 0
    assert "ERROR: no matching distribution" in done.stdout + done.stderr
    assert "the demo ran" not in done.stdout
