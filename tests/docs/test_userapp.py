"""The example user project (examples/userapp) as a new user gets it: tasklease and the app
installed into a fresh virtual environment from a clean copy of this checkout (no editable
install, no system site-packages), the app's tests run through the installed pytest plugin,
and its deploy planned with `tasklease deploy --dry-run`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checkout import install_example, run

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def userapp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the fresh venv's bin directory, the user's project directory)."""
    installed = install_example(tmp_path_factory.mktemp("userpath"), "userapp")
    return installed.bin_dir, installed.app


def test_a_plain_install_brings_what_a_deployed_worker_imports(
    userapp: tuple[Path, Path],
) -> None:
    bin_dir, app = userapp
    probe = run(
        bin_dir / "python",
        "-c",
        "import gunicorn, google.cloud.firestore, tasklease.worker.wsgi, myapp.tasks; print('ok')",
        cwd=app,
    )
    assert probe.stdout.strip() == "ok", probe.stderr
    assert (bin_dir / "gunicorn").exists()


def test_the_example_projects_tests_pass_with_the_installed_plugin(
    userapp: tuple[Path, Path],
) -> None:
    bin_dir, app = userapp
    result = run(bin_dir / "pytest", "-q", "-p", "no:cacheprovider", cwd=app)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout


def test_tasklease_deploy_plans_the_example_projects_deploy(userapp: tuple[Path, Path]) -> None:
    bin_dir, app = userapp
    result = run(bin_dir / "tasklease", "deploy", "--dry-run", cwd=app)
    assert result.returncode == 0, result.stderr
    [deploy] = [line for line in result.stdout.splitlines() if line.startswith("gcloud run deploy")]
    assert f"--source={app.resolve()}" in deploy
    assert "TASKLEASE_ROUTER=myapp.tasks:router" in deploy
    assert "gcloud scheduler jobs create http weekly_digest" in result.stdout
    assert f"# would write {app.resolve() / 'Procfile'}" in result.stdout
    assert not (app / "Procfile").exists()


def test_the_installed_package_carries_the_init_template(
    userapp: tuple[Path, Path], tmp_path: Path
) -> None:
    bin_dir, _ = userapp
    result = run(
        bin_dir / "tasklease", "deploy", "--init", "--router=shop.jobs:router", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert 'router = "shop.jobs:router"' in (tmp_path / "tasklease.toml").read_text()


def test_the_installed_cli_runs_outside_a_checkout(
    userapp: tuple[Path, Path], tmp_path: Path
) -> None:
    """Every file the demo serves ships in the wheel: it runs from an empty directory (without
    the workflows extra, leaving out its Workflows proxy job and saying how to add it)."""
    bin_dir, _ = userapp
    version = run(bin_dir / "tasklease", "--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("tasklease "), version.stderr
    demo = run(
        bin_dir / "tasklease", "demo", "--orders=20", "--customers=4", "--seed=3", cwd=tmp_path
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "every side effect happened exactly once" in demo.stdout
    assert "pip install 'tasklease[workflows]'" in demo.stdout
