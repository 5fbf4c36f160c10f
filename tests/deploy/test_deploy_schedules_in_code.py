"""`tasklease deploy` plans the Cloud Scheduler jobs the router declares in code, with the
tasklease.toml's [[job]] tables over them; `--init` writes a [[job]] only for a scheduled
handler with no schedule in code. Run as a user does: the installed `tasklease` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.deploy.test_deploy_checks_the_users_project import tasklease
from tests.support.checkout import ROOT

TASKS = """
from datetime import timedelta

from tasklease import JobRetry, Router

router = Router()


@router.scheduled(
    "nightly_reports",
    schedule="0 3 * * *",
    time_zone="Europe/Paris",
    retry=JobRetry(retry_count=3, max_backoff_duration=timedelta(minutes=10)),
    description="nightly reports",
)
def nightly_reports(ctx):
    return None


@router.scheduled("cleanup")
def cleanup(ctx):
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
    assert tasklease(source, "--init", "--project=acme-prod").returncode == 0
    return source


def job_command(stdout: str, name: str) -> str:
    [line] = [line for line in stdout.splitlines() if f"scheduler jobs create http {name} " in line]
    return line


def test_a_dry_run_plans_the_job_declared_in_code(tmp_path: Path) -> None:
    planned = tasklease(project(tmp_path), "--dry-run")
    assert planned.returncode == 0, planned.stderr
    line = job_command(planned.stdout, "nightly_reports")
    for flag in (
        "'--schedule=0 3 * * *'",
        "--time-zone=Europe/Paris",
        "/jobs/nightly_reports",
        "'--description=nightly reports'",
        "--max-retry-attempts=3",
        "--max-backoff=600s",
    ):
        assert flag in line, (flag, line)
    assert "jobs create http cleanup" not in planned.stdout  # No schedule anywhere yet.


def test_init_writes_a_job_only_for_a_handler_with_no_schedule_in_code(tmp_path: Path) -> None:
    written = (project(tmp_path) / "tasklease.toml").read_text()
    assert '# name = "cleanup"' in written
    assert "nightly_reports" not in written


def test_a_table_of_the_same_name_overrides_the_codes_fields_in_the_plan(tmp_path: Path) -> None:
    source = project(tmp_path)
    config = source / "tasklease.toml"
    config.write_text(
        config.read_text()
        + '\n[[job]]\nname = "nightly_reports"\ntime_zone = "Etc/UTC"\n'
        + "[job.retry]\nretry_count = 1\n"
        + '\n[[job]]\nname = "cleanup"\nschedule = "*/30 * * * *"\n'
    )
    planned = tasklease(source, "--dry-run")
    assert planned.returncode == 0, planned.stderr
    line = job_command(planned.stdout, "nightly_reports")
    assert "'--schedule=0 3 * * *'" in line  # The code's: the table leaves it out.
    assert "--time-zone=Etc/UTC" in line and "--max-retry-attempts=1" in line  # The table's.
    assert "--max-backoff=600s" in line  # The code's retry, key by key.
    assert "'--schedule=*/30 * * * *'" in job_command(planned.stdout, "cleanup")


def test_a_table_overriding_a_schedule_no_handler_declares_is_refused(tmp_path: Path) -> None:
    source = project(tmp_path)
    config = source / "tasklease.toml"
    config.write_text(config.read_text() + '\n[[job]]\nname = "cleanup"\nretry_count = 1\n')
    planned = tasklease(source, "--dry-run")
    assert planned.returncode == 2
    assert "job cleanup: retry_count is not a [[job]] field" in planned.stderr
    config.write_text(config.read_text().replace("retry_count = 1", 'time_zone = "Etc/UTC"'))
    planned = tasklease(source, "--dry-run")
    assert planned.returncode == 2
    assert "job cleanup: schedule is missing" in planned.stderr


def test_the_kits_script_plans_the_job_declared_in_code_too(tmp_path: Path) -> None:
    source = project(tmp_path)
    script, config = ROOT / "tasklease" / "deploy" / "deploy.py", source / "tasklease.toml"
    planned = subprocess.run(
        [sys.executable, str(script), "--dry-run", f"--source={source}", f"--config={config}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert planned.returncode == 0, planned.stderr
    assert "--time-zone=Europe/Paris" in job_command(planned.stdout, "nightly_reports")


def test_a_router_that_does_not_import_is_said_and_the_files_jobs_deployed(
    tmp_path: Path,
) -> None:
    source = project(tmp_path)
    (source / "myapp" / "tasks.py").write_text("import a_dependency_not_installed\n")
    config = source / "tasklease.toml"
    config.write_text(config.read_text() + '\n[[job]]\nname = "cleanup"\nschedule = "0 1 * * *"\n')
    planned = tasklease(source, "--dry-run")
    assert "does not import here" in planned.stderr
    assert "deploying no schedule declared in code" in planned.stderr
    assert "jobs create http cleanup" in planned.stdout
    assert "nightly_reports" not in planned.stdout
