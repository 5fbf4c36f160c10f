"""A job's schedule: unix-cron (:mod:`tasklease.cron`) or English-like
(:mod:`tasklease.emulator.groc`), in a time zone; validated as Cloud Scheduler validates it, by
being able to fire.

A cron expression that croniter parses may still never fire (``0 0 31 2 *``: February has no
31st). Cloud Scheduler refuses what it cannot schedule, so :func:`check` asks for a next time
at creation. Time zones are tz database names, matched without regard to case when the exact
one is unknown (:func:`tasklease.cron.zone`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from tasklease import cron
from tasklease.emulator import groc


@dataclass(frozen=True)
class Schedule:
    """A schedule and its zone. ``unix_cron``: whether runs have a schedule time to send
    (``X-CloudScheduler-ScheduleTime`` is only sent for unix-cron jobs)."""

    text: str
    zone: ZoneInfo
    english: groc.Groc | None
    slots: cron.Cron | None = None  # A unix-cron schedule's slots.

    @property
    def unix_cron(self) -> bool:
        return self.english is None

    def next_time(self, after: datetime) -> datetime:
        """The first run strictly after ``after``, in UTC; ValueError if there is none."""
        if self.english is not None:
            return self.english.next_time(after, self.zone).astimezone(UTC)
        assert self.slots is not None
        return self.slots.next_slot(after)


def parse(text: str, time_zone: str) -> Schedule:
    """The schedule of ``text`` in ``time_zone``; ValueError saying why it is not one."""
    zone = cron.zone(time_zone)
    if cron.is_cron(text):
        return Schedule(text, zone, None, cron.Cron(text, time_zone))
    try:
        english = groc.parse(text)
    except ValueError as exc:
        raise ValueError(
            f"{text!r} is neither unix-cron nor an English-like schedule: {exc}"
        ) from exc
    return Schedule(text, zone, english)


def check(text: str, time_zone: str, now: datetime) -> Schedule:
    """:func:`parse`, and refuse a schedule that has no run after ``now``."""
    schedule = parse(text, time_zone)
    if schedule.slots is not None:
        cron.check(text, time_zone, now)
        return schedule
    try:
        schedule.next_time(now)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"schedule {text!r} never fires: {exc}") from exc
    return schedule
