"""The README's own-app steps ("Your own app, from `pip install` to a deploy plan"), run as
written, line by line, in a new project directory with a fresh virtual environment.

Two liberties: tasklease itself is installed first from a clean copy of this checkout (the
steps' `pip install -e .` then finds it there, as it would find it on the index), and
`tasklease dev` gets free ports and is stopped once its worker is ready; the final
`tasklease deploy` (a real deploy) is not run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.checkout import clean_copy
from tests.support.dev_stack import ctrl_c, dev_flags, kill_all, processes_with, read_until

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def readme_steps() -> list[str]:
    """The commands of the README's own-app block, comments and blank lines left out."""
    text = (ROOT / "README.md").read_text()
    section = text.split("### Your own app, from `pip install` to a deploy plan", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_the_readme_names_the_editable_install_and_dev_without_a_router() -> None:
    steps = readme_steps()
    assert "pip install -e . pytest" in steps
    assert "tasklease dev" in steps


def test_the_readmes_own_app_steps_work_as_written(tmp_path: Path) -> None:
    checkout = clean_copy(tmp_path / "tasklease")
    project = tmp_path / "myproject"
    example = checkout / "examples" / "userapp"
    project.mkdir()
    shutil.copy(example / "pyproject.toml", project)
    shutil.copytree(example / "myapp", project / "myapp")
    # The user's tests: the example's that need no [[job]] table yet (the README adds the
    # jobs to tasklease.toml after `deploy --init`).
    (project / "tests").mkdir()
    shutil.copy(example / "tests" / "conftest.py", project / "tests")
    example_tests = (example / "tests" / "test_tasks.py").read_text()
    (project / "tests" / "test_tasks.py").write_text(
        example_tests.split("def test_the_weekly_digest", 1)[0]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("TASKLEASE_STORE", None)

    def sh(line: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", line],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    steps = readme_steps()
    assert steps[0] == "python -m venv .venv && . .venv/bin/activate"
    made = subprocess.run(
        [sys.executable, "-m", "venv", ".venv"], cwd=project, capture_output=True, check=False
    )
    assert made.returncode == 0, made.stderr
    env["VIRTUAL_ENV"] = str(project / ".venv")
    env["PATH"] = f"{project / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
    base = sh(f"pip install --quiet {checkout}")
    assert base.returncode == 0, base.stderr
    for step in steps[1:]:
        if step == "tasklease deploy":
            continue  # A real deploy.
        if step == "tasklease dev":
            run_dev(project, env)
            continue
        done = sh(step)
        assert done.returncode == 0, f"{step}:\n{done.stdout}\n{done.stderr}"
        if step == "pytest":
            assert "2 passed" in done.stdout, done.stdout


def run_dev(project: Path, env: dict[str, str]) -> None:
    """`tasklease dev` (free ports), until its worker for the router in tasklease.toml is
    ready; then Ctrl-C, and nothing of it left running."""
    marker = "readme-" + os.urandom(8).hex()
    process = subprocess.Popen(
        ["tasklease", "dev", *dev_flags()],
        cwd=project,
        env={**env, "TASKLEASE_TEST_MARKER": marker, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output = read_until(process, "Dashboard (runs", timeout=120)
        assert "worker for myapp.tasks:router" in output
        ctrl_c(process)
        process.communicate(timeout=60)
        assert process.returncode == 0
        assert processes_with(marker) == []
    finally:
        kill_all(marker)
