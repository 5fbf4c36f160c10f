"""The test project served by a real WSGI server (gunicorn): settings from the environment
(``TASKLEASE_DJANGO_TMP``: a temporary folder for the database and the run store)."""

from __future__ import annotations

import os
from pathlib import Path

import django
from django.conf import settings
from django.core.wsgi import get_wsgi_application

_TMP = Path(os.environ["TASKLEASE_DJANGO_TMP"])

settings.configure(
    SECRET_KEY="tests-only",
    ALLOWED_HOSTS=["127.0.0.1"],
    USE_TZ=True,
    INSTALLED_APPS=["tasklease.django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(_TMP / "app.db")}},
    ROOT_URLCONF="tests.django_project.urls",
    TASKS={
        "default": {
            "BACKEND": "tasklease.django.CloudTasksBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"project": "p", "location": "l", "worker_url": "http://127.0.0.1/worker"},
        }
    },
    TASKLEASE_STORE=f"sqlite:///{_TMP / 'runs.db'}",
    TASKLEASE_AUTH="none",
)
django.setup()
application = get_wsgi_application()
