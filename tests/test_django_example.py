"""The Django example (examples/django_app) as a new user gets it: tasklease[django] and the
project installed into a fresh virtual environment from a clean copy of this checkout, and
its own tests run there (Django's test client, the outbox relay, the stub queue)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.checkout import clean_copy
from tests.test_userapp import run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def django_app(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the fresh venv's bin directory, the example's project directory)."""
    tmp = tmp_path_factory.mktemp("django")
    checkout = clean_copy(tmp / "tasklease")
    app = shutil.copytree(checkout / "examples" / "django_app", tmp / "django_app")
    venv = tmp / "venv"
    created = run(sys.executable, "-m", "venv", venv, cwd=tmp)
    assert created.returncode == 0, created.stderr
    bin_dir = venv / "bin"
    installed = run(
        bin_dir / "python", "-m", "pip", "install", "--quiet",
        f"{checkout}[django]", f"{app}[test]",
        cwd=tmp,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return bin_dir, app


def test_the_examples_own_tests_pass_in_a_fresh_environment(
    django_app: tuple[Path, Path],
) -> None:
    bin_dir, app = django_app
    result = run(bin_dir / "pytest", "-q", "-p", "no:cacheprovider", cwd=app)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_a_plain_install_of_the_example_brings_djangos_tasks_framework(
    django_app: tuple[Path, Path],
) -> None:
    bin_dir, app = django_app
    probe = run(
        bin_dir / "python", "-c",
        "import os, django; os.environ['DJANGO_SETTINGS_MODULE'] = 'shop.settings'; "
        "django.setup(); import tasklease.django.compat, shop.tasks; print('ok')",
        cwd=app,
    )  # fmt: skip
    assert probe.stdout.strip() == "ok", probe.stderr
