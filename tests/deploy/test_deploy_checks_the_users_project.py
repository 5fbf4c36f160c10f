"""`tasklease deploy` checks what only the user's own project can tell: a [[job]] naming no
scheduled handler is refused before any gcloud call, `--init` writes a [[job]] per scheduled
handler, and the upload leaves out a local virtual environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
TASKS = """
from tasklease import Router

router = Router()


@router.scheduled("nightly")
def nightly(ctx):
    return None


@router.task("send")
def send(payload, ctx):
    return None
"""


def project(tmp_path: Path) -> Path:
    source = tmp_path / "shop"
    (source / "myapp").mkdir(parents=True)
    (source / "myapp" / "__init__.py").write_text("")
    (source / "myapp" / "tasks.py").write_text(TASKS)
    (source / "pyproject.toml").write_text(
        '[project]\nname = "shop"\nversion = "1"\ndependencies = ["tasklease"]\n'
    )
    (source / ".venv" / "lib").mkdir(parents=True)
    return source


def tasklease(source: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [BIN / "tasklease", "deploy", *args],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_init_writes_a_job_for_each_scheduled_handler(tmp_path: Path) -> None:
    source = project(tmp_path)
    assert tasklease(source, "--init", "--project=acme-prod").returncode == 0
    config = source / "tasklease.toml"
    written = config.read_text()
    assert '# [[job]]\n# name = "nightly"\n' in written  # Commented out until scheduled.
    assert 'name = "send"' not in written  # A task handler is not a Scheduler job.
    config.write_text(
        written.replace("# [[job]]", "[[job]]")
        .replace('# name = "nightly"', 'name = "nightly"')
        .replace('# schedule = "0 3', 'schedule = "0 3')
        .replace("# time_zone", "time_zone")
    )
    planned = tasklease(source, "--dry-run")
    assert planned.returncode == 0, planned.stderr
    assert "gcloud scheduler jobs create http nightly" in planned.stdout


def test_a_job_naming_no_scheduled_handler_is_refused_before_any_gcloud_call(
    tmp_path: Path,
) -> None:
    source = project(tmp_path)
    assert tasklease(source, "--init", "--project=acme-prod").returncode == 0
    config = source / "tasklease.toml"
    config.write_text(config.read_text() + '\n[[job]]\nname = "nightlyy"\nschedule = "0 3 * * *"\n')
    planned = tasklease(source, "--dry-run")
    assert planned.returncode == 2
    assert "job nightlyy: myapp.tasks:router has no @router.scheduled('nightlyy')" in (
        planned.stderr
    )
    assert "(it has: nightly)" in planned.stderr
    assert "gcloud" not in planned.stdout


def test_the_upload_leaves_out_a_local_virtual_environment(tmp_path: Path) -> None:
    source = project(tmp_path)
    assert tasklease(source, "--init", "--project=acme-prod").returncode == 0
    planned = tasklease(source, "--dry-run")
    assert f"# would write {source.resolve() / '.gcloudignore'}" in planned.stdout
    assert not (source / ".gcloudignore").exists()
    from tasklease.deploy.source import ensure_gcloudignore  # noqa: PLC0415

    ensure_gcloudignore(source, dry_run=False)
    assert ".venv/" in (source / ".gcloudignore").read_text().splitlines()
