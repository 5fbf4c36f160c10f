"""Django settings for the tasklease.django tests: a SQLite database and run store in a
temporary directory, the outbox table created by the app's own migration.

With ``TASKLEASE_DJANGO_TEST_POSTGRES`` set to a ``postgresql://`` URL (an empty database),
the app's database is that one, through Django's psycopg 3 backend
(test_django_postgres.py runs the tests so)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import django
import pytest
from django.conf import settings

from tasklease.producer import Producer
from tasklease.producer.memory import MemoryTransport, QueuedTask

_TMP = Path(tempfile.mkdtemp(prefix="tasklease-django-"))
DATABASE = _TMP / "app.db"
WORKER_URL = "http://testserver/worker"
POSTGRES = os.environ.get("TASKLEASE_DJANGO_TEST_POSTGRES")
OUTBOX_URL = POSTGRES or f"sqlite:///{DATABASE}"  # The relay's view of the app's database.


def _database() -> dict[str, Any]:
    if not POSTGRES:
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(DATABASE)}
    url = urlsplit(POSTGRES)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": url.path.lstrip("/"),
        "USER": url.username,
        "HOST": url.hostname,
        "PORT": url.port,
    }


if not settings.configured:
    settings.configure(
        SECRET_KEY="tests-only",
        ALLOWED_HOSTS=["testserver"],
        USE_TZ=True,
        INSTALLED_APPS=["tasklease.django"],
        DATABASES={"default": _database()},
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


@pytest.fixture(autouse=True)
def _process_time_zone_kept() -> Iterator[None]:
    """Put the process's time zone back after each test. ``override_settings(TIME_ZONE=...)``
    sets ``TZ`` and calls ``time.tzset()`` (Django's setting_changed handler), and on exit
    sets it to the settings' own TIME_ZONE, Django's default ``America/Chicago``, not back to
    unset: every later test in the session read naive local times 6 hours off."""
    saved = os.environ.get("TZ")
    yield
    if saved is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = saved
    time.tzset()


@pytest.fixture
def queue(monkeypatch: pytest.MonkeyPatch) -> MemoryTransport:
    """A fresh in-memory Cloud Tasks queue behind the default backend's producer, and no
    task calls noted yet."""
    # Imported here: both need Django set up (above).
    from tasklease.django import compat  # noqa: PLC0415
    from tests.django_project import tasks  # noqa: PLC0415

    transport = MemoryTransport()
    backend = compat.tasks.task_backends["default"]
    monkeypatch.setattr(
        backend, "producer", Producer("p", "l", worker_url=WORKER_URL, transport=transport)
    )
    tasks.CALLS.clear()
    return transport


def deliver(client: Any, queued: QueuedTask, retry: int | None = None) -> Any:
    """Deliver ``queued`` through Django's test ``client`` as Cloud Tasks would (its
    headers), as its ``retry``-th retry when given; the response."""
    responses: list[Any] = []

    def post(path: str, headers: dict[str, str], data: bytes) -> Any:
        sent = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        if retry is not None:
            sent["X-CloudTasks-TaskRetryCount"] = str(retry)
            sent["X-CloudTasks-TaskExecutionCount"] = str(retry)
        response = client.post(path, data=data, content_type="application/json", headers=sent)
        responses.append(response)
        return response

    MemoryTransport().deliver(queued, post, queued.request.queue_path.rsplit("/", 1)[-1])
    return responses[0]


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_TMP, ignore_errors=True)
