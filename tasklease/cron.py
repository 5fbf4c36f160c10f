"""Cron math: the slots of a unix-cron schedule in a time zone, as instants (UTC).

One helper for everything that computes a job's slots: the emulator's scheduler, the stub
scheduler of the pytest plugin, and the stuck-jobs check. It is croniter's enumeration, with
the two questions asked of it (the next slot after a moment, the last slot at or before one)
answered so that they agree: ``last_slot(t) <= t < next_slot(last_slot(t))``, always.

Daylight saving time. Cloud Scheduler "runs on wall clock time" in the job's time zone
(default ``Etc/UTC``), and Google documents only that around a change jobs may "run or not run
unexpectedly": a time that occurs twice "may observe execution anomalies", and UTC avoids the
problem (cloud.google.com/scheduler/docs/configuring/cron-job-schedules, "Time zone"). The
slots here are croniter's, which ``tests/worker/test_cron.py`` pins:

- a wall time the spring-forward gap skips fires once, at the end of the gap (``30 2 * * *``
  in Europe/Paris on 2026-03-29 fires at 03:00 CEST);
- a wall time the fall-back overlap repeats fires at both instants (``30 2 * * *`` in
  Europe/Paris on 2026-10-25 fires at 00:30 and 01:30 UTC), each a run of its own, since a
  run's identity is its schedule time as an instant; so too when the overlap is half an hour
  (Australia/Lord_Howe) or starts off the hour (Pacific/Chatham).

croniter's get_next from before or inside a repeated hour's first pass may skip its second
pass (a half-hour overlap, or a slot a year on at the same offset): :meth:`Cron.next_slot`
also asks it from the start of that second pass. croniter's get_prev and get_next do not
always agree around a repeated hour either: the slots are get_next's, and
:meth:`Cron.last_slot` walks them forward rather than trusting get_prev.

Slots are compared as instants, never as wall times: two datetimes with the same ``ZoneInfo``
compare by wall time and ignore ``fold``, which put a slot of the repeated hour "before" a
moment it follows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter

_SECOND = timedelta(seconds=1)
# Longer than any clock change in the tz database (Antarctica/Troll's is two hours).
_LONGEST_SHIFT = timedelta(hours=3)


@dataclass(frozen=True)
class Cron:
    """A unix-cron ``expression`` in ``time_zone`` (a tz database name); ValueError saying
    why when it is not one."""

    expression: str
    time_zone: str = "Etc/UTC"

    def __post_init__(self) -> None:
        if not is_cron(self.expression):
            raise ValueError(f"{self.expression!r} is not a unix-cron schedule")
        zone(self.time_zone)

    @property
    def tzinfo(self) -> ZoneInfo:
        return zone(self.time_zone)

    def next_slot(self, after: datetime) -> datetime:
        """The first slot strictly after ``after``, in UTC; ValueError (croniter's
        CroniterBadDateError) if there is none."""
        moment = _aware(after).astimezone(UTC)
        following = self._croniter_next(moment)
        # croniter's get_next from before a repeated hour's second pass may skip that pass:
        # from 01:56 LHDT (Australia/Lord_Howe, 2026-04-05) */7 went on to 02:00 LHST, past
        # 01:35..01:56 LHST; 5 2 25 10 * from 02:10 CEST (Europe/Paris, 2026-10-25) went on
        # to 2027. From inside the second pass it finds them: ask it from there too.
        repeat = self._repeat_after(moment)
        if repeat is not None and repeat < following:
            second = repeat if self._matches(repeat) else self._croniter_next(repeat)
            following = min(following, second)
        return following

    def last_slot(self, at: datetime) -> datetime:
        """The latest slot at or before ``at``, in UTC; ValueError if there is none."""
        moment = _aware(at).astimezone(UTC)
        # croniter's get_prev is strictly before its start, and slots fall on whole seconds:
        # from one second past ``at`` (floored) it finds ``at`` itself when ``at`` is a slot.
        start = moment.replace(microsecond=0) + timedelta(seconds=1)
        walk = croniter(self.expression, start.astimezone(self.tzinfo))
        walk.get_prev(datetime)
        try:
            earlier: datetime = walk.get_prev(datetime)  # Two back: see below.
        except ValueError:  # The first slot there is (croniter's CroniterBadDateError).
            earlier = croniter(self.expression, start.astimezone(self.tzinfo)).get_prev(datetime)
        # Around a repeated hour croniter's get_prev and get_next disagree: get_prev may pass
        # over a slot of the first pass (30 2 29 10,11 * in Europe/Paris on 2028-10-29 went
        # back to 2027), or find one of the second pass that get_next from the first skips
        # (59 2 29 3,10 *). The slots are get_next's: walk forward from the slot two back.
        slot = self.next_slot(earlier.astimezone(UTC) - timedelta(seconds=1))
        while (following := self.next_slot(slot)) <= moment:
            slot = following
        return slot

    def _croniter_next(self, moment: datetime) -> datetime:
        following: datetime = croniter(self.expression, moment.astimezone(self.tzinfo)).get_next(
            datetime
        )
        return following.astimezone(UTC)

    def _repeat_after(self, moment: datetime) -> datetime | None:
        """The start (UTC) of the second pass of a repeated wall time (clocks going back) in
        ``(moment, moment + _LONGEST_SHIFT]``, or None: the instant the offset drops."""
        low = moment.replace(microsecond=0)
        high = low + _LONGEST_SHIFT
        offset = self._offset(low)
        if self._offset(high) >= offset:
            return None
        while high - low > _SECOND:  # Offsets change on whole seconds.
            middle = low + _SECOND * ((high - low) // _SECOND // 2)
            if self._offset(middle) == offset:
                low = middle
            else:
                high = middle
        return high if high > moment else None

    def _offset(self, moment: datetime) -> timedelta:
        offset = moment.astimezone(self.tzinfo).utcoffset()
        assert offset is not None  # A ZoneInfo always has one.
        return offset

    def _matches(self, moment: datetime) -> bool:
        """Whether the wall time of ``moment`` in the zone is one the expression names."""
        wall = moment.astimezone(self.tzinfo).replace(tzinfo=None)
        found: datetime = croniter(self.expression, wall - _SECOND).get_next(datetime)
        return found == wall

    def is_slot(self, moment: datetime) -> bool:
        """Whether ``moment`` is one of the slots."""
        return self.last_slot(moment) == _aware(moment).astimezone(UTC)


def is_cron(expression: str) -> bool:
    """Whether croniter reads ``expression`` as cron (five fields, or six with seconds)."""
    return isinstance(expression, str) and bool(croniter.is_valid(expression))


def check(expression: str, time_zone: str, now: datetime) -> Cron:
    """The schedule, refused (ValueError) if it has no slot after ``now``: a cron that croniter
    parses may still never fire (``0 0 31 2 *``: February has no 31st), and Cloud Scheduler
    refuses what it cannot schedule."""
    cron = Cron(expression, time_zone)
    try:
        cron.next_slot(now)
    except (ValueError, OverflowError) as exc:  # croniter's CroniterBadDateError is one.
        raise ValueError(f"schedule {expression!r} never fires: {exc}") from exc
    return cron


def zone(name: str) -> ZoneInfo:
    """The zone of a tz database name, matched exactly or else without case (Google's
    Job.time_zone: "For UTC use the string "utc""); ValueError for an unknown one."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        pass
    found = _zones_by_lower_name().get(name.lower()) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"Invalid time zone {name!r}")
    return ZoneInfo(found)


@functools.cache
def _zones_by_lower_name() -> dict[str, str]:
    return {name.lower(): name for name in available_timezones()}


def _aware(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} has no time zone: pass an aware datetime")
    return moment
