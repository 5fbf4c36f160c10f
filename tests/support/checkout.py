"""A clean copy of this checkout (the files a fresh clone has, symlinks kept as symlinks),
and its examples installed from it into fresh virtual environments, as a new user gets them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def clean_copy(destination: Path) -> Path:
    """Copy the tracked files (and new ones not ignored) of this checkout into ``destination``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    for name in filter(None, listed.stdout.decode().split("\0")):
        source, target = ROOT / name, destination / name
        if source.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(source), target)
        elif source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def run(*args: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``args`` run as a new user runs them: none of this test run's Python or pytest
    settings in the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [str(arg) for arg in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass(frozen=True)
class InstalledExample:
    """A fresh virtual environment with a clean copy of this checkout and one of its
    examples installed into it."""

    bin_dir: Path
    app: Path  # The example's project directory (a copy).
    checkout: Path  # The clean copy of this checkout it was installed from.


def install_example(
    tmp: Path,
    example: str,
    *,
    extra: str = "",
    python: Path = Path(sys.executable),
    tools: Sequence[str] = (),
) -> InstalledExample:
    """``examples/EXAMPLE`` and tasklease (with ``[extra]``, if given) from a clean copy of
    this checkout, installed with the example's ``[test]`` extra and ``tools`` into a new
    venv of ``python``, all under ``tmp``."""
    checkout = clean_copy(tmp / "tasklease")
    app = shutil.copytree(checkout / "examples" / example, tmp / example)
    venv = tmp / "venv"
    created = run(python, "-m", "venv", venv, cwd=tmp)
    assert created.returncode == 0, created.stderr
    bin_dir = venv / "bin"
    # pip's cache and this machine's configured indexes keep this to seconds after a first run;
    # --no-compile: pip's byte-compiling of every dependency is most of a cached install.
    installed = run(
        bin_dir / "python", "-m", "pip", "install", "--quiet", "--no-compile",
        f"{checkout}[{extra}]" if extra else checkout, f"{app}[test]", *tools,
        cwd=tmp,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return InstalledExample(bin_dir, app, checkout)
