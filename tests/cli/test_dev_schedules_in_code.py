"""`tasklease dev` creates the router's schedules in code as jobs of its local Cloud Scheduler,
calling its worker, with a jobs file's [[job]] tables over them; they fire. Real processes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.support.dev_stack import Dev, dev_flags, write_project

SHOP = """
from tasklease import JobRetry, Router, TaskContext

router = Router()


@router.scheduled("nightly", schedule="0 3 * * *", time_zone="Europe/Paris",
                  retry=JobRetry(retry_count=2))
def nightly(ctx: TaskContext) -> None:
    pass
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path, SHOP)


def running(project: Path, extra: list[str]) -> Iterator[Dev]:
    stack = Dev(project, dev_flags(), extra)
    try:
        yield stack
    finally:
        stack.stop()


def schedule_hour(run: dict[str, object]) -> int:
    """The UTC hour of a manual run's schedule time: the next slot, in the job's zone."""
    identity = run["identity"]
    assert isinstance(identity, dict)
    return datetime.fromisoformat(str(identity["schedule_time"]).replace("Z", "+00:00")).hour


def test_a_schedule_declared_in_code_is_a_job_of_the_dev_scheduler_and_fires(
    project: Path,
) -> None:
    for dev in running(project, []):  # No --scheduler-config: the router's jobs alone.
        assert "scheduler job nightly: 0 3 * * * (Europe/Paris)" in dev.banner
        triggered = dev.tasklease("scheduler", "run", "nightly", "--emulator", dev.emulator)
        assert triggered.returncode == 0, triggered.stderr
        run = dev.wait_for_run("nightly", "completed")
        assert run["kind"] == "scheduler"
        assert schedule_hour(run) in (1, 2)  # 03:00 in Paris: CET or CEST.


def test_a_jobs_file_table_of_the_same_name_overrides_the_codes_fields(project: Path) -> None:
    (project / "jobs.toml").write_text('[[job]]\nname = "nightly"\ntime_zone = "Asia/Tokyo"\n')
    for dev in running(project, ["--scheduler-config", "jobs.toml"]):
        assert "scheduler job nightly: 0 3 * * * (Asia/Tokyo)" in dev.banner
        triggered = dev.tasklease("scheduler", "run", "nightly", "--emulator", dev.emulator)
        assert triggered.returncode == 0, triggered.stderr
        run = dev.wait_for_run("nightly", "completed")
        assert schedule_hour(run) == 18  # 03:00 in Tokyo (the table's zone) is 18:00 UTC.
