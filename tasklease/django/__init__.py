"""tasklease for Django: a backend for Django's Tasks framework and the worker's URLs.

    INSTALLED_APPS = [..., "tasklease.django"]
    TASKS = {"default": {"BACKEND": "tasklease.django.CloudTasksBackend", "OPTIONS": {...}}}
    urlpatterns = [..., path("worker/", include("tasklease.django.urls"))]

``pip install 'tasklease[django]'``: Django 6 (``django.tasks``), or on Python 3.11 Django 5.2
with the ``django-tasks`` backport. Nothing here is imported by tasklease itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasklease.lazy import lazy_exports

if TYPE_CHECKING:
    from tasklease.django.backend import CloudTasksBackend
    from tasklease.django.handler import DJANGO_TASK_HANDLER

_EXPORTS: dict[str, str] = {
    "CloudTasksBackend": "tasklease.django.backend",
    "DJANGO_TASK_HANDLER": "tasklease.django.handler",
}

__all__ = ["DJANGO_TASK_HANDLER", "CloudTasksBackend"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
