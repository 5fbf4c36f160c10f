"""The shop's settings: its database, the tasklease app and backend, from the environment."""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,testserver").split(",")
USE_TZ = True

INSTALLED_APPS = ["shop", "tasklease.django"]  # tasklease's migration: the outbox table.
ROOT_URLCONF = "shop.urls"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_DATABASE", str(BASE_DIR / "db.sqlite3")),
    }
}

# my_task.enqueue(...) creates a Cloud Task; inside transaction.atomic() it is staged in the
# outbox and the relay creates it after the commit. Unset options come from TASKLEASE_*
# variables (TASKLEASE_PROJECT, TASKLEASE_LOCATION, TASKLEASE_SERVICE_ACCOUNT, ...).
TASKS = {
    "default": {
        "BACKEND": "tasklease.django.CloudTasksBackend",
        "OPTIONS": {
            "worker_url": os.environ.get("TASKLEASE_WORKER_URL", "http://localhost:8000/worker")
        },
    }
}
# The worker's settings (urls.py includes it under /worker/): TASKLEASE_STORE, TASKLEASE_AUTH
# and TASKLEASE_AUDIENCE are read from the environment when not set here.
