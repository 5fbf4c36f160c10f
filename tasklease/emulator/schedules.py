"""A job's schedule: unix-cron (croniter) or English-like (:mod:`tasklease.emulator.groc`),
in a time zone; validated as Cloud Scheduler validates it, by being able to fire.

A cron expression that croniter parses may still never fire (``0 0 31 2 *``: February has no
31st); croniter then raises when asked for the next time. Cloud Scheduler refuses what it
cannot schedule, so :func:`check` asks for a next time at creation. Time zones are tz database
names; Google's Job.time_zone docs say "For UTC use the string "utc"", so names are matched
without regard to case when the exact one is unknown.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter

from tasklease.emulator import groc


@dataclass(frozen=True)
class Schedule:
    """A schedule and its zone. ``unix_cron``: whether runs have a schedule time to send
    (``X-CloudScheduler-ScheduleTime`` is only sent for unix-cron jobs)."""

    text: str
    zone: ZoneInfo
    english: groc.Groc | None

    @property
    def unix_cron(self) -> bool:
        return self.english is None

    def next_time(self, after: datetime) -> datetime:
        """The first run strictly after ``after``, in UTC; ValueError if there is none."""
        if self.english is not None:
            return self.english.next_time(after, self.zone).astimezone(UTC)
        local = after.astimezone(self.zone)
        following: datetime = croniter(self.text, local).get_next(datetime)
        return following.astimezone(UTC)


def parse(text: str, time_zone: str) -> Schedule:
    """The schedule of ``text`` in ``time_zone``; ValueError saying why it is not one."""
    zone = zone_of(time_zone)
    if croniter.is_valid(text):
        return Schedule(text, zone, None)
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
    try:
        schedule.next_time(now)
    except (ValueError, OverflowError) as exc:  # croniter's CroniterBadDateError is one.
        raise ValueError(f"schedule {text!r} never fires: {exc}") from exc
    return schedule


def zone_of(name: str) -> ZoneInfo:
    """The zone of a tz database name, matched exactly or else without case."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        pass
    found = _zones_by_lower_name().get(name.lower())
    if found is None:
        raise ValueError(f"Invalid time zone {name!r}")
    return ZoneInfo(found)


@functools.cache
def _zones_by_lower_name() -> dict[str, str]:
    return {zone.lower(): zone for zone in available_timezones()}
