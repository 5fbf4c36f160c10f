"""The delivery counts left at exit are written on every supported Python: 3.12 refuses a new
thread at interpreter shutdown, and the exit flush used to start one, so a worker process
under Python 3.12 dropped its last minute of counts (and printed a RuntimeError at exit)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
from collections import Counter
from datetime import UTC, datetime
from tasklease.worker import tally_flusher

class FileTally:
    def write_delivery_counts(self, instance, counts):
        with open(sys.argv[1], "a") as out:
            out.write(repr(sorted((str(k), dict(v)) for k, v in counts.items())) + "\\n")

counter = tally_flusher.DeliveryCounter(FileTally(), lambda: datetime.now(UTC), interval=3600)
counter.count("task", "charge", "processed")
tally_flusher._FLUSHER.watch(counter)
"""


def python_312_or_newer() -> str | None:
    """An interpreter of Python 3.12 or newer on this machine (pyenv's, then PATH), or None.
    pyenv's shims on PATH name every version it has, selected or not, so each candidate is
    asked for its version."""
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    candidates += [found for name in ("python3.12", "python3.13") if (found := shutil.which(name))]
    for python in candidates:
        asked = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info >= (3, 12))"],
            capture_output=True,
            text=True,
            check=False,
        )
        if asked.returncode == 0 and asked.stdout.strip() == "True":
            return python
    return None


def interpreters() -> list[str]:
    found = python_312_or_newer()
    if found is None and os.environ.get("CI") == "true":
        return [sys.executable, "missing python3.12"]
    return [sys.executable] + ([found] if found else [])


@pytest.mark.parametrize("python", interpreters())
def test_the_last_counts_are_written_at_exit(python: str, tmp_path: Path) -> None:
    if python == "missing python3.12":
        pytest.fail("no Python 3.12 or newer on this machine (CI=true needs one)")
    written = tmp_path / "counts"
    done = subprocess.run(
        [python, "-c", SCRIPT, str(written)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert "can't create new thread" not in done.stderr
    assert written.exists(), done.stderr
    assert "outcome='processed'): 1" in written.read_text()
