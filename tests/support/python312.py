"""Python 3.12, for what the project's 3.11 venv cannot prove: Django 6 (which needs 3.12) and
3.12's interpreter shutdown. ``python3.12`` on PATH, else a pyenv build; with CI=true a missing
one fails the test, elsewhere it skips it."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

PYENV_GLOB = "/root/.pyenv/versions/3.12*/bin/python3.12"


@functools.cache
def find_python312() -> Path | None:
    """A Python 3.12 that runs (a pyenv shim on PATH may not: it is checked by running it)."""
    candidates = [shutil.which("python3.12"), *sorted(glob.glob(PYENV_GLOB), reverse=True)]
    for candidate in filter(None, candidates):
        try:
            probe = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except OSError:
            continue
        if probe.stdout.strip() == "True":
            return Path(candidate)
    return None


def python312() -> Path:
    """Python 3.12's interpreter, or the test fails (CI=true) or skips without it."""
    found = find_python312()
    if found is None:
        message = f"no Python 3.12: python3.12 on PATH or {PYENV_GLOB}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found
