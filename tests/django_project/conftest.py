"""Django settings for the tasklease.django tests: a SQLite database and run store in a
temporary directory, the outbox table created by the app's own migration."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import django
import pytest
from django.conf import settings

_TMP = Path(tempfile.mkdtemp(prefix="tasklease-django-"))
DATABASE = _TMP / "app.db"
WORKER_URL = "http://testserver/worker"

if not settings.configured:
    settings.configure(
        SECRET_KEY="tests-only",
        ALLOWED_HOSTS=["testserver"],
        USE_TZ=True,
        INSTALLED_APPS=["tasklease.django"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(DATABASE)}},
        ROOT_URLCONF="tests.django_project.urls",
        TASKS={
            "default": {
                "BACKEND": "tasklease.django.CloudTasksBackend",
                "QUEUES": ["default", "emails"],
                "OPTIONS": {"project": "p", "location": "l", "worker_url": WORKER_URL},
            }
        },
        TASKLEASE_STORE=f"sqlite:///{_TMP / 'runs.db'}",
        TASKLEASE_AUTH="none",
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_TMP, ignore_errors=True)
