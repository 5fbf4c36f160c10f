"""The summary's rule over run records (core/activity.py) and the attempt timeline's
(core/timeline.py): pure functions, records and times in."""

from __future__ import annotations

from datetime import timedelta

from tasklease.worker.core.activity import percentile, summarize, window_start
from tasklease.worker.core.decisions import operator_release, replay_pending
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.core.timeline import BarEnd, timeline
from tests.support.helpers import T0

NOW = T0 + timedelta(hours=2, seconds=30)


def record(run_id: str, minutes_ago: float, status: RunStatus, **changes: object) -> RunRecord:
    claimed = NOW - timedelta(minutes=minutes_ago)
    fields: dict[str, object] = {
        "run_id": run_id,
        "kind": "task",
        "handler": "send",
        "status": status,
        "attempt_id": "a1",
        "fencing_token": 1,
        "attempts": 1,
        "lease_expires": claimed + timedelta(minutes=5),
        "expire_at": claimed + timedelta(days=7),
        "claimed_at": claimed,
    }
    if status in (RunStatus.COMPLETED, RunStatus.FAILED):
        fields["finished_at"] = claimed + timedelta(seconds=2)
    fields.update(changes)
    return RunRecord(**fields)  # type: ignore[arg-type]


def test_the_window_ends_with_the_minute_that_holds_now() -> None:
    start = window_start(NOW)
    assert start == T0 + timedelta(hours=1, minutes=1)
    assert NOW - start < timedelta(hours=1)


def test_runs_count_in_the_minute_of_their_latest_claim_by_how_they_stand_now() -> None:
    runs = [
        record("a", 0.2, RunStatus.COMPLETED),
        record("b", 0.1, RunStatus.FAILED),
        record("c", 30, RunStatus.RELEASED),
        record("d", 10, RunStatus.IN_PROGRESS),  # Its lease lapsed 5 minutes ago: stuck.
        record("e", 0.3, RunStatus.IN_PROGRESS),
        record("old", 90, RunStatus.COMPLETED),  # Before the window: not counted.
    ]
    (send,) = summarize(runs, NOW).handlers
    assert len(send.claimed) == 60
    assert send.claimed[-1] == {"completed": 1, "failed": 1, "in_progress": 1}
    assert send.claimed[-11] == {"stuck": 1}
    assert send.claimed[-31] == {"released": 1}
    assert sum(sum(c.values()) for c in send.claimed) == 5
    assert sum(send.finished) == 2  # a and b finished in the window; old finished before it.
    assert send.states["stuck"] == 1
    assert send.peak == 3


def test_handler_time_is_the_latest_attempts_claim_to_finish_of_finished_runs_only() -> None:
    runs = [
        record(str(n), 1, RunStatus.COMPLETED, finished_at=NOW - timedelta(minutes=1) + s)
        for n, s in enumerate(timedelta(seconds=x) for x in range(1, 101))
    ]
    runs.append(record("released", 1, RunStatus.RELEASED))
    (send,) = summarize(runs, NOW).handlers
    assert (send.p50, send.p99, send.timed) == (50.0, 99.0, 100)


def test_percentiles_are_nearest_rank_values_that_occurred() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.99) == 4.0


def test_dead_letters_and_stuck_runs_of_any_age_count_per_handler_and_add_up() -> None:
    old_failed = record("f", 600, RunStatus.FAILED, handler="charge")
    old_stuck = record("s", 300, RunStatus.IN_PROGRESS, handler="sync")
    summary = summarize(
        [record("a", 1, RunStatus.COMPLETED)],
        NOW,
        dead_letters=[old_failed],
        stuck=[old_stuck],
    )
    by_name = {h.handler: h for h in summary.handlers}
    assert (by_name["charge"].dead_letters, by_name["charge"].runs) == (1, 0)
    assert by_name["sync"].stuck == 1
    assert [h.handler for h in summary.handlers] == ["sync", "charge", "send"]
    total = summary.total
    assert (total.runs, total.dead_letters, total.stuck) == (1, 1, 1)
    assert total.p50 is None  # Percentiles do not add up across handlers.


def test_a_read_cut_short_at_its_limit_marks_the_minutes_it_did_not_reach() -> None:
    runs = [record("a", 5, RunStatus.COMPLETED)]
    assert not summarize(runs, NOW).truncated
    cut = summarize(runs, NOW, oldest_read=runs[0].claimed_at)
    assert cut.truncated and cut.complete_since == runs[0].claimed_at


def test_a_finished_run_is_one_bar_from_claim_to_finish_with_its_token() -> None:
    done = record("a", 3, RunStatus.COMPLETED, fencing_token=4)
    line = timeline(done, NOW)
    (bar,) = line.bars
    assert (bar.start, bar.end, bar.ends) == (done.claimed_at, done.finished_at, BarEnd.COMPLETED)
    assert (bar.fencing_token, bar.earlier, line.notes) == (4, 0, [])
    assert (line.position(bar.start), line.position(bar.end)) == (0.0, 1.0)


def test_earlier_attempts_are_counted_not_drawn_since_the_record_keeps_no_times() -> None:
    third = record("a", 3, RunStatus.COMPLETED, attempts=3, fencing_token=3, attempt_id="a3")
    line = timeline(third, NOW)
    assert line.bars[0].earlier == 2
    assert "2 earlier attempts (fencing tokens below 3" in line.notes[0]
    assert "their times are not drawn" in line.notes[0]


def test_a_live_attempt_runs_to_now_and_its_lease_on_and_a_lapsed_one_to_its_lease() -> None:
    live = record("a", 1, RunStatus.IN_PROGRESS)
    (bar,) = timeline(live, NOW).bars
    assert (bar.end, bar.ends, bar.lease_until) == (NOW, BarEnd.RUNNING, live.lease_expires)
    stuck = record("b", 20, RunStatus.IN_PROGRESS)
    line = timeline(stuck, NOW)
    assert (line.bars[0].end, line.bars[0].ends) == (stuck.lease_expires, BarEnd.LAPSED)
    assert "not how many there were" in line.notes[0]


def test_an_operator_release_and_replay_links_show_as_such() -> None:
    live = record("a", 1, RunStatus.IN_PROGRESS)
    released = operator_release(live, NOW, "operator-1", force=True).record
    assert released is not None
    (bar,) = timeline(released, NOW).bars
    assert (bar.ends, bar.by_operator, bar.end) == (BarEnd.RELEASED, True, NOW)
    failed = record("f", 30, RunStatus.FAILED)
    pending = replay_pending(failed, "r", {}, NOW)
    line = timeline(pending, NOW, replay_of=failed)
    assert [(b.role, b.ends) for b in line.bars] == [
        ("replay of", BarEnd.FAILED),
        ("this run", BarEnd.PENDING),
    ]
    assert line.start == failed.claimed_at and line.end == NOW
    assert "no attempt has run yet" in line.notes[-1]
