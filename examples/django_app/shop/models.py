"""An order, written in the same transaction as the task that sends its receipt."""

from __future__ import annotations

from django.db import models


class Order(models.Model):  # type: ignore[misc] # Django ships no types (django-stubs does).
    total = models.IntegerField()
    receipt_sent = models.BooleanField(default=False)
