"""The Django app: ``INSTALLED_APPS = [..., "tasklease.django"]`` (its migration creates the
outbox table, ``tasklease_outbox``, in each database migrated)."""

from __future__ import annotations

from django.apps import AppConfig


class TaskleaseConfig(AppConfig):  # type: ignore[misc] # Django ships no types.
    name = "tasklease.django"
    label = "tasklease"
    verbose_name = "tasklease"
    default = True
