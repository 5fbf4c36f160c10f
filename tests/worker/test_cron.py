"""The cron helper's promises as properties: the last slot at or before a moment and the next
slot after it bracket the moment, slots only grow, they are the instants croniter enumerates
(and the second passes of repeated wall times it skips), and daylight saving changes in
Europe/Paris, America/New_York and Australia/Lord_Howe go as the module documents."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tasklease import cron
from tasklease.cron import Cron

ZONES = ["Etc/UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
# Daylight saving changes (UTC) of those zones: moments near them are drawn often.
CHANGES = [
    datetime(2026, 3, 29, 1, tzinfo=UTC),  # Paris: 02:00 CET -> 03:00 CEST.
    datetime(2026, 10, 25, 1, tzinfo=UTC),  # Paris: 03:00 CEST -> 02:00 CET.
    datetime(2026, 3, 8, 7, tzinfo=UTC),  # New York: 02:00 EST -> 03:00 EDT.
    datetime(2026, 11, 1, 6, tzinfo=UTC),  # New York: 02:00 EDT -> 01:00 EST.
    datetime(2026, 4, 4, 15, tzinfo=UTC),  # Lord Howe: half an hour back.
    datetime(2026, 10, 3, 15, 30, tzinfo=UTC),  # Lord Howe: half an hour forward.
]
expressions = st.builds(
    " ".join,
    st.tuples(
        st.sampled_from(["*", "0", "30", "*/15", "5,35", "*/7", "59"]),
        st.sampled_from(["*", "0", "1", "2", "1,2,3", "*/6", "2-3"]),
        st.sampled_from(["*", "*", "1", "15", "*/10", "29"]),
        st.sampled_from(["*", "*", "3", "10,11", "*/2"]),
        st.sampled_from(["*", "*", "0", "1-5", "7"]),
    ),
)
near_a_change = st.builds(
    lambda change, seconds, micros: change + timedelta(seconds=seconds, microseconds=micros),
    st.sampled_from(CHANGES),
    st.integers(min_value=-6 * 3600, max_value=6 * 3600),
    st.sampled_from([0, 0, 1, 500_000, 999_999]),
)
anywhere = st.datetimes(
    min_value=datetime(2025, 1, 1), max_value=datetime(2027, 12, 31), timezones=st.just(UTC)
)
moments = st.one_of(near_a_change, anywhere)
schedules = st.builds(Cron, expressions, st.sampled_from(ZONES))


@settings(max_examples=400, deadline=None)
@given(schedules, moments)
@example(Cron("*/7 * * * *", "Australia/Lord_Howe"), datetime(2026, 4, 4, 15, 3, tzinfo=UTC))
@example(Cron("* 2 * * *", "Pacific/Chatham"), datetime(2026, 4, 4, 14, 0, 17, tzinfo=UTC))
def test_the_last_slot_and_the_next_one_bracket_every_moment(job: Cron, moment: datetime) -> None:
    last = job.last_slot(moment)
    assert last <= moment < job.next_slot(last)
    assert job.next_slot(moment) == job.next_slot(last)  # Nothing lies between them.


@settings(max_examples=300, deadline=None)
@given(schedules, moments, st.integers(min_value=1, max_value=6))
def test_next_slot_is_strictly_increasing(job: Cron, moment: datetime, steps: int) -> None:
    slots = [job.next_slot(moment)]
    for _ in range(steps):
        slots.append(job.next_slot(slots[-1]))
    assert moment < slots[0]
    assert all(a < b for a, b in itertools.pairwise(slots))
    assert all(job.is_slot(slot) for slot in slots)


@settings(max_examples=200, deadline=None)
@given(schedules, moments)
def test_the_slots_are_the_instants_croniter_enumerates_and_the_second_passes_it_skips(
    job: Cron, moment: datetime
) -> None:
    start = moment - timedelta(days=2)
    walk = croniter(job.expression, start.astimezone(ZoneInfo(job.time_zone)))
    enumerated = [walk.get_next(datetime).astimezone(UTC) for _ in range(8)]
    slots = [job.next_slot(start)]
    while slots[-1] < enumerated[-1]:
        slots.append(job.next_slot(slots[-1]))
    assert set(enumerated) <= set(slots)
    skipped = set(slots) - set(enumerated)
    assert all(slot.astimezone(job.tzinfo).fold == 1 for slot in skipped)  # A second pass.
    for slot, following in itertools.pairwise(slots):
        assert job.last_slot(slot) == slot
        between = slot + (following - slot) / 2
        assert job.last_slot(between) == slot


PARIS, NEW_YORK = "Europe/Paris", "America/New_York"


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "time_zone", "after", "expected"),
    [
        # A wall time the spring-forward gap skips fires once, at the end of the gap.
        ("30 2 * * *", PARIS, "2026-03-28T12:00", ["2026-03-29T01:00", "2026-03-30T00:30"]),
        ("30 2 * * *", NEW_YORK, "2026-03-07T12:00", ["2026-03-08T07:00", "2026-03-09T06:30"]),
        # A wall time the fall-back overlap repeats fires at both instants.
        ("30 2 * * *", PARIS, "2026-10-24T12:00", ["2026-10-25T00:30", "2026-10-25T01:30"]),
        ("30 1 * * *", NEW_YORK, "2026-10-31T12:00", ["2026-11-01T05:30", "2026-11-01T06:30"]),
        # Hourly: no slot in the skipped hour, one in each pass of the repeated one.
        ("0 * * * *", PARIS, "2026-03-29T00:30", ["2026-03-29T01:00", "2026-03-29T02:00"]),
        ("0 * * * *", PARIS, "2026-10-25T00:30", ["2026-10-25T01:00", "2026-10-25T02:00"]),
    ],
)
def test_daylight_saving_changes_go_as_documented(
    expression: str, time_zone: str, after: str, expected: list[str]
) -> None:
    job, moment, found = Cron(expression, time_zone), utc(after), []
    for _ in expected:
        moment = job.next_slot(moment)
        found.append(moment)
    assert found == [utc(e) for e in expected]
    assert [job.last_slot(slot) for slot in found] == found


def test_the_last_slot_in_the_first_pass_of_a_repeated_hour_is_not_in_the_second() -> None:
    """02:47 CEST on 2026-10-25 (the first pass): the last slot of ``*/30`` is 02:30 CEST, not
    02:30 CET an hour later, which compares as earlier by wall time."""
    job = Cron("*/30 * * * *", "Europe/Paris")
    assert job.last_slot(datetime(2026, 10, 25, 0, 47, tzinfo=UTC)) == datetime(
        2026, 10, 25, 0, 30, tzinfo=UTC
    )


def test_the_last_slot_in_the_second_pass_of_a_repeated_hour_may_be_in_the_first() -> None:
    """02:00 CET on 2028-10-29 (the second pass): the last slot of ``30 2 29 10,11 *`` is
    02:30 CEST that day, which croniter's get_prev passed over for 2027-11-29."""
    job = Cron("30 2 29 10,11 *", "Europe/Paris")
    assert job.last_slot(datetime(2028, 10, 29, 1, 0, tzinfo=UTC)) == datetime(
        2028, 10, 29, 0, 30, tzinfo=UTC
    )


def test_the_last_slot_is_one_next_slot_enumerates_around_a_repeated_hour() -> None:
    """02:59 on 2028-10-29 in Europe/Paris fires in both passes (CEST, then CET), though
    croniter's get_next from 02:59 CEST skips the second: the last slot after it is 02:59 CET,
    and the next slots go through both."""
    job = Cron("59 2 29 3,10 *", "Europe/Paris")
    last = job.last_slot(datetime(2029, 1, 12, 12, 59, tzinfo=UTC))
    assert last == datetime(2028, 10, 29, 1, 59, tzinfo=UTC)
    assert job.next_slot(datetime(2028, 10, 29, 0, 59, tzinfo=UTC)) == last
    assert job.next_slot(last) == datetime(2029, 3, 29, 0, 59, tzinfo=UTC)


def test_a_half_hour_repeated_by_lord_howe_fires_in_both_passes() -> None:
    """Australia/Lord_Howe puts its clocks back half an hour at 02:00 LHDT on 2026-04-05
    (15:00 UTC): ``*/7`` fires at 01:35..01:56 in the second pass too, where croniter's get_next
    from 01:56 LHDT went on to 02:00 LHST, and the last slot of a moment there was 01:56 LHDT
    with a next slot after the moment's."""
    job = Cron("*/7 * * * *", "Australia/Lord_Howe")
    first_pass_end = datetime(2026, 4, 4, 14, 56, tzinfo=UTC)  # 01:56 LHDT.
    slots = [job.next_slot(first_pass_end)]
    while len(slots) < 5:
        slots.append(job.next_slot(slots[-1]))
    assert slots == [utc(f"2026-04-04T15:{m:02}") for m in (5, 12, 19, 26, 30)]
    moment = utc("2026-04-04T15:03")  # 01:33 LHST, the second pass.
    assert job.last_slot(moment) == first_pass_end
    assert job.next_slot(job.last_slot(moment)) == job.next_slot(moment) == slots[0]


def test_a_yearly_time_in_a_repeated_hour_fires_in_its_second_pass() -> None:
    """``5 2 25 10 *`` in Europe/Paris from 02:10 CEST on 2026-10-25: 02:05 CET that day comes
    next, not 02:05 CEST a year later (croniter's get_next, the offsets a year apart being
    the same)."""
    job = Cron("5 2 25 10 *", "Europe/Paris")
    assert job.next_slot(utc("2026-10-25T00:10")) == utc("2026-10-25T01:05")


@pytest.mark.parametrize("expression", ["0 0 31 2 *", "0 0 30 2 *"])
def test_a_schedule_that_never_fires_is_refused(expression: str) -> None:
    with pytest.raises(ValueError, match="never fires"):
        cron.check(expression, "Etc/UTC", datetime(2026, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(
    ("expression", "time_zone", "message"),
    [("every 5 minutes", "Etc/UTC", "unix-cron"), ("0 3 * * *", "Mars/Olympus", "time zone")],
)
def test_what_is_not_a_schedule_is_refused(expression: str, time_zone: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Cron(expression, time_zone)


def test_time_zones_match_without_case_as_google_takes_utc() -> None:
    assert cron.zone("utc") == ZoneInfo("UTC")
    assert Cron("0 3 * * *", "europe/paris").next_slot(
        datetime(2026, 7, 1, tzinfo=UTC)
    ) == datetime(2026, 7, 1, 1, tzinfo=UTC)


def test_a_naive_moment_is_refused() -> None:
    with pytest.raises(ValueError, match="no time zone"):
        Cron("0 3 * * *").next_slot(datetime(2026, 7, 1))
