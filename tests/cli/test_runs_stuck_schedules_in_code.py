"""`tasklease runs stuck` knows the schedules a router declares in code (``--router``, else the
``[worker] router`` of ./tasklease.toml), with the file's [[job]] tables over them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from tasklease.cli.runs import Exit
from tasklease.testing.operations_contract import seed_every_state
from tasklease.worker.stores import SqliteStore
from tests.cli.test_cli_runs import as_json, tasklease

TASKS = """
from tasklease import Router

router = Router()
router.scheduled("nightly", schedule="*/5 * * * *", time_zone="Europe/Paris")(lambda ctx: None)

from tasklease.worker import create_app
from tasklease.worker.stores import MemoryStore

app = create_app(router, store=MemoryStore(), auth="none")
"""


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A SQLite store with one run in every state (nightly's only success a manual run)."""
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    seed_every_state(store, datetime.now(UTC) - timedelta(hours=1))
    store.close()
    return f"sqlite:///{path}"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A project directory (the current one) with a router module of a name of its own."""
    module = f"shop_{uuid.uuid4().hex[:8]}"
    directory = tmp_path / "project"
    (directory / module).mkdir(parents=True)
    (directory / module / "__init__.py").write_text(TASKS)
    monkeypatch.chdir(directory)
    return directory, f"{module}:router"


def test_stuck_reports_a_job_declared_in_code_that_missed_its_slot(
    store_url: str, project: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, router = project
    code, report = as_json(capsys, "runs", "stuck", "--store", store_url, "--router", router)
    assert code == Exit.STUCK
    [job] = report["jobs"]
    assert (job["name"], job["schedule"], job["last_success"]) == ("nightly", "*/5 * * * *", None)


def test_stuck_takes_the_router_of_tasklease_toml_and_its_tables_over_the_code(
    store_url: str, project: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, router = project
    (directory / "tasklease.toml").write_text(
        f'[worker]\nrouter = "{router}"\n\n[[job]]\nname = "nightly"\nschedule = "0 0 * * 0"\n'
        '\n[[job]]\nname = "weekly"\nschedule = "0 0 * * 0"\n'
    )
    code, report = as_json(capsys, "runs", "stuck", "--store", store_url)
    assert code == Exit.STUCK
    assert [(job["name"], job["schedule"]) for job in report["jobs"]] == [
        ("nightly", "0 0 * * 0"),  # The table's schedule over the code's.
        ("weekly", "0 0 * * 0"),
    ]


def test_a_configured_router_that_does_not_import_leaves_the_files_jobs_checked(
    store_url: str, project: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _ = project
    (directory / "tasklease.toml").write_text(
        '[worker]\nrouter = "nowhere.tasks:router"\n\n[[job]]\nname = "weekly"\n'
        'schedule = "0 0 * * 0"\n'
    )
    code, out, err = tasklease(capsys, "runs", "stuck", "--store", store_url, "--json")
    assert code == Exit.STUCK
    assert "not checking the schedules in code of nowhere.tasks:router" in err
    assert "weekly" in out and "nightly" not in out.split('"jobs"')[1]


def test_a_router_named_on_the_command_line_must_import(
    store_url: str, project: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = tasklease(
        capsys, "runs", "stuck", "--store", store_url, "--router", "nowhere.tasks:router"
    )
    assert code == Exit.FAILED
    assert "nowhere" in err


def test_the_dashboard_lists_a_job_declared_in_code_that_missed_its_slot(
    store_url: str, project: tuple[Path, str]
) -> None:
    from tasklease.cli.code_schedules import code_schedules  # noqa: PLC0415
    from tasklease.cli.dashboard import serving_dashboard  # noqa: PLC0415
    from tasklease.plumbing.serve import free_port  # noqa: PLC0415

    declared = code_schedules(project[1])
    with serving_dashboard(store_url, "127.0.0.1", free_port(), None, declared=declared) as url:
        page = requests.get(f"{url}stuck", timeout=10)
    assert page.status_code == 200
    assert "nightly" in page.text and "*/5 * * * *" in page.text


def test_a_flask_app_of_create_app_stands_for_its_router(project: tuple[Path, str]) -> None:
    from tasklease.cli.code_schedules import code_schedules  # noqa: PLC0415

    [job] = code_schedules(project[1].replace(":router", ":app"))
    assert (job.name, job.schedule, job.time_zone) == ("nightly", "*/5 * * * *", "Europe/Paris")
