"""The Django example (examples/django_app) as a new user gets it: tasklease[django] and the
project installed into a fresh virtual environment from a clean copy of this checkout, and
its own tests run there (Django's test client, the outbox relay, the stub queue). Twice: on
Python 3.12 with Django 6 (``django.tasks``) from PyPI, and on this Python 3.11 with Django
5.2 and the django-tasks backport (Django 6 needs 3.12): the extra's markers pick them."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.checkout import install_example, run
from tests.support.python312 import python312

pytestmark = pytest.mark.slow

EXAMPLE_TESTS = "7 passed"


@dataclass(frozen=True)
class Environment:
    """A fresh venv with the example installed, and what Django's Tasks framework is there."""

    bin_dir: Path
    app: Path
    checkout: Path  # The clean copy of this checkout it was installed from.
    framework: str  # The module: "django.tasks" (Django 6) or "django_tasks" (the backport).
    django_major: int


# Each run's framework module and Django's major version there. Django 6 runs on Python 3.12
# (found, or the test fails with CI=true), the backport on this interpreter (3.11).
PYTHONS = {"python3.12-django6": ("django.tasks", 6), "python3.11-backport": ("django_tasks", 5)}


@pytest.fixture(scope="module", params=sorted(PYTHONS))
def django_app(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Environment:
    """The example installed in a venv of ``request.param``'s Python, once per test run."""
    framework, major = PYTHONS[request.param]
    python = python312() if major == 6 else Path(sys.executable)
    # Django 6 also runs tasklease's own Django tests (tests/django_project), which need these.
    tools = ["pytest", "pytest-httpserver"] if major == 6 else []
    installed = install_example(
        tmp_path_factory.mktemp(request.param),
        "django_app",
        extra="django",
        python=python,
        tools=tools,
    )
    return Environment(installed.bin_dir, installed.app, installed.checkout, framework, major)


def test_the_examples_own_tests_pass_in_a_fresh_environment(django_app: Environment) -> None:
    result = run(django_app.bin_dir / "pytest", "-q", "-p", "no:cacheprovider", cwd=django_app.app)
    assert result.returncode == 0, result.stdout + result.stderr
    assert EXAMPLE_TESTS in result.stdout
    assert result.stderr == ""  # Nor a traceback at exit (Python 3.12 refuses exit threads).


def test_a_plain_install_of_the_example_brings_djangos_tasks_framework(
    django_app: Environment,
) -> None:
    probe = run(
        django_app.bin_dir / "python", "-c",
        "import os, django; os.environ['DJANGO_SETTINGS_MODULE'] = 'shop.settings'; "
        "django.setup(); import tasklease.django.compat as c, shop.tasks; "
        "print(django.VERSION[0], c.tasks.__name__)",
        cwd=django_app.app,
    )  # fmt: skip
    assert probe.stdout.split() == [str(django_app.django_major), django_app.framework], (
        probe.stderr
    )


@pytest.mark.parametrize("django_app", ["python3.12-django6"], indirect=True)
def test_tasklease_django_tests_pass_on_django_6(django_app: Environment) -> None:
    """tests/django_project on Django 6 (this suite runs it on the backport): the outbox, the
    worker's URLs and views, OIDC, the emulator's deliveries. Postgres's rerun stays on 3.11."""
    result = run(
        django_app.bin_dir / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "tests/django_project", "--ignore=tests/django_project/test_django_postgres.py",
        cwd=django_app.checkout,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout and "skipped" not in result.stdout
