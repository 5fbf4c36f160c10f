"""With ``USE_TZ = False`` Django's Tasks framework takes a naive ``run_after``: a datetime in
the project's ``TIME_ZONE``, as ``timezone.now()`` returns it then. The backend must send it
to Cloud Tasks as that moment, not refuse a task Django itself validated."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from django.test import override_settings
from django.utils import timezone

from tasklease.producer.memory import MemoryTransport
from tests.django_project import tasks


def test_a_naive_run_after_without_use_tz_is_scheduled_in_the_projects_time_zone(
    queue: MemoryTransport,
) -> None:
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        when = timezone.now() + timedelta(minutes=5)  # Naive, Paris time.
        assert timezone.is_naive(when)
        tasks.email.using(run_after=when).enqueue("a@example.com")
    (created,) = queue.tasks
    expected: datetime = when.replace(tzinfo=ZoneInfo("Europe/Paris"))
    assert created.request.schedule_time == expected
