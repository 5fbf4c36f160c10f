"""English-like ("App Engine cron") schedules, which Cloud Scheduler accepts besides unix-cron.

No maintained package on PyPI parses them (the App Engine SDK's own ``groc`` parser is not in
``appengine-python-standard``), so this implements the grammar the App Engine cron.yaml
reference documents, and no more:

- ``every N (hours|mins|minutes)``, optionally ``from HH:MM to HH:MM`` (a window, which may
  run past midnight) or ``synchronized`` (slots from 00:00 every N);
- ``(every|ORDINALS) (day|WEEKDAYS) [of (month|MONTHS)] HH:MM``, ORDINALS such as
  ``1st,third`` (the nth such weekday of the month);
- ``DAYS of (month|MONTHS) HH:MM``, DAYS such as ``1,15`` (days of the month).

An interval with neither window nor ``synchronized`` runs N after the previous run, so its
runs have no fixed slots: Cloud Scheduler does not guarantee ``X-CloudScheduler-ScheduleTime``
for any English-like schedule, and the emulator sends none for them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

_ORDINALS = {"1st": 1, "first": 1, "2nd": 2, "second": 2, "3rd": 3, "third": 3}
_ORDINALS |= {"4th": 4, "fourth": 4, "5th": 5, "fifth": 5}
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_MONTHS = (
    *("january", "february", "march", "april", "may", "june", "july"),
    *("august", "september", "october", "november", "december"),
)
_UNITS = {"hour": 60, "hours": 60, "min": 1, "mins": 1, "minute": 1, "minutes": 1}
_INTERVAL = re.compile(
    r"every (\d+) (\w+)(?: from (\d\d?:\d\d) to (\d\d?:\d\d)| (synchronized))?", re.ASCII
)
_SPECIFIC = re.compile(r"(\S+) (\S+)(?: of (\S+))? (\d\d?:\d\d)", re.ASCII)
_MONTH_DAYS = re.compile(r"(\d\d?(?:,\d\d?)*) of (\S+) (\d\d?:\d\d)", re.ASCII)
_SEARCH_DAYS = 5 * 366  # Every day-of-month and weekday combination recurs within this.


@dataclass(frozen=True)
class Groc:
    """A parsed English-like schedule."""

    interval: timedelta | None = None
    window: tuple[time, time] | None = None  # Slots of the interval between these, daily.
    ordinals: frozenset[int] = frozenset()  # Empty: every matching weekday.
    weekdays: frozenset[int] = frozenset()  # Empty with no month_days: every day.
    month_days: frozenset[int] = frozenset()
    months: frozenset[int] = frozenset(range(1, 13))
    at: time = time(0, 0)

    @property
    def has_slots(self) -> bool:
        """Whether runs fall on fixed times (not N after the previous run)."""
        return self.interval is None or self.window is not None

    def next_time(self, after: datetime, zone: ZoneInfo) -> datetime:
        """The first run strictly after ``after`` (aware), aware in ``zone``."""
        local = after.astimezone(zone)
        if self.interval is not None and self.window is None:
            return local + self.interval
        for offset in range(-1, _SEARCH_DAYS):
            day = local.date() + timedelta(days=offset)
            for moment in self._day_slots(day, zone):
                if moment > after:
                    return moment
        raise ValueError("the schedule never fires")

    def _day_slots(self, day: date, zone: ZoneInfo) -> list[datetime]:
        if self.interval is not None and self.window is not None:
            start, end = (datetime.combine(day, t, zone) for t in self.window)
            if end < start:
                end += timedelta(days=1)
            slots: list[datetime] = []
            while start <= end:
                slots.append(start)
                start += self.interval
            return slots
        if day.month not in self.months or not self._day_matches(day):
            return []
        return [datetime.combine(day, self.at, zone)]

    def _day_matches(self, day: date) -> bool:
        if self.month_days:
            return day.day in self.month_days
        if self.weekdays and day.weekday() not in self.weekdays:
            return False
        return not self.ordinals or (day.day - 1) // 7 + 1 in self.ordinals


def parse(schedule: str) -> Groc:
    """Parse an English-like schedule; ValueError saying why it is not one."""
    text = " ".join(schedule.lower().split())
    if match := _INTERVAL.fullmatch(text):
        count, unit, start, end, synchronized = match.groups()
        if unit not in _UNITS or int(count) <= 0:
            raise ValueError(f"every {count} {unit}: not a positive number of hours or minutes")
        interval = timedelta(minutes=int(count) * _UNITS[unit])
        if interval > timedelta(days=1):
            raise ValueError("an interval is at most 24 hours")
        window = None
        if start is not None:
            window = (_time(start), _time(end))
        elif synchronized:
            window = (time(0, 0), time(23, 59))
        return Groc(interval=interval, window=window)
    if match := _MONTH_DAYS.fullmatch(text):
        days, months, at = match.groups()
        numbers = frozenset(int(day) for day in days.split(","))
        if not all(1 <= day <= 31 for day in numbers):
            raise ValueError(f"{days!r} are not days of a month")
        return Groc(at=_time(at), months=_months(months), month_days=numbers)
    match = _SPECIFIC.fullmatch(text)
    if match is None:
        raise ValueError(f"{schedule!r} is not an English-like schedule")
    which, days, months, at = match.groups()
    ordinals, weekdays = _days(which, days)
    return Groc(at=_time(at), months=_months(months), ordinals=ordinals, weekdays=weekdays)


def _days(which: str, days: str) -> tuple[frozenset[int], frozenset[int]]:
    """The ordinals and weekdays of ``(every|ORDINALS) (day|WEEKDAYS)``."""
    ordinals: frozenset[int] = frozenset()
    if which != "every":
        ordinals = frozenset(_pick(which, _ORDINALS, "ordinal"))
    if days == "day":
        if ordinals:
            raise ValueError("ordinals need weekdays, not 'day'")
        return ordinals, frozenset()
    names = {name: i for i, name in enumerate(_WEEKDAYS)}
    names |= {name[:3]: i for i, name in enumerate(_WEEKDAYS)}
    return ordinals, frozenset(_pick(days, names, "weekday"))


def _months(months: str | None) -> frozenset[int]:
    if months in (None, "month"):
        return frozenset(range(1, 13))
    assert months is not None
    names = {name: i + 1 for i, name in enumerate(_MONTHS)}
    names |= {name[:3]: i + 1 for i, name in enumerate(_MONTHS)}
    names |= {"sept": 9}
    return frozenset(_pick(months, names, "month"))


def _pick(items: str, names: dict[str, int], kind: str) -> list[int]:
    unknown = [item for item in items.split(",") if item not in names]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a {kind}")
    return [names[item] for item in items.split(",")]


def _time(text: str) -> time:
    hours, minutes = (int(part) for part in text.split(":"))
    if hours > 23 or minutes > 59:
        raise ValueError(f"{text!r} is not a time of day")
    return time(hours, minutes)
