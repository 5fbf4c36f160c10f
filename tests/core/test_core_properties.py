"""The pure core's rules as properties over any sequence of deliveries, finishes and clocks:
a fencing token never decreases, no takeover happens inside MAX_CLOCK_SKEW of a lease's end,
a finished run stays finished, and a lock's token outgrows a purge of its record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from tasklease.worker.core import constants as c
from tasklease.worker.core import decisions, locking
from tasklease.worker.core.records import (
    ClaimRequest,
    LockRecord,
    LockRequest,
    RunRecord,
    RunStatus,
    Verdict,
)

START = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
RETENTION = timedelta(hours=1)
FINISHED = {RunStatus.COMPLETED: Verdict.COMPLETED, RunStatus.FAILED: Verdict.FAILED}

# One step: how far the clock moves (up to past the retention), then what the holder does.
steps = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=int(RETENTION.total_seconds() * 1.2 * 1000)),
        st.sampled_from(["claim", "renew", "complete", "fail", "release", "nothing"]),
    ),
    min_size=1,
    max_size=30,
)


def request(attempt: int) -> ClaimRequest:
    return ClaimRequest(
        run_id="run",
        kind="task",
        handler="h",
        attempt_id=f"attempt-{attempt}",
        lease=LEASE,
        retention=RETENTION,
    )


def act(record: RunRecord, action: str, now: datetime) -> RunRecord:
    """What the attempt holding ``record`` writes, if it still holds it."""
    if record.status is not RunStatus.IN_PROGRESS:
        return record
    if action == "renew":
        return decisions.renewed(record, now + LEASE, RETENTION)
    if action == "complete":
        return decisions.completed(record, '{"ok": true}', now)
    if action == "fail":
        return decisions.failed(record, "bad input", None, now)
    if action == "release":
        return decisions.released(record, "try again", now)
    return record


@settings(max_examples=300, deadline=None)
@given(steps)
def test_a_fencing_token_never_decreases_and_grows_with_every_claim(
    history: list[tuple[int, str]],
) -> None:
    record: RunRecord | None = None
    now = START
    for attempt, (millis, action) in enumerate(history):
        now += timedelta(milliseconds=millis)
        before = record.fencing_token if record else 0
        answer = decisions.claim(record, request(attempt), now)
        if answer.verdict is Verdict.CLAIMED:
            assert answer.record.fencing_token == before + 1
        record = answer.record
        assert record.fencing_token >= before
        record = act(record, action, now)
        assert record.fencing_token >= before


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=0, max_value=int(c.MAX_CLOCK_SKEW.total_seconds() * 1e6) - 1),
    st.integers(min_value=1, max_value=10**6),
)
def test_no_takeover_happens_inside_the_clock_skew_after_a_lease_ends(
    past_expiry_us: int, renewals: int
) -> None:
    held = decisions.claim(None, request(0), START).record
    held = decisions.renewed(held, START + LEASE * renewals, RETENTION)
    now = held.lease_expires + timedelta(microseconds=past_expiry_us)
    answer = decisions.claim(held, request(1), now)
    assert answer.verdict is Verdict.IN_PROGRESS
    assert answer.record == held
    taken = decisions.claim(held, request(1), held.lease_expires + c.MAX_CLOCK_SKEW)
    assert taken.verdict is Verdict.CLAIMED and taken.took_over_from == held.attempt_id


@settings(max_examples=300, deadline=None)
@given(steps, st.sampled_from(sorted(FINISHED)))
def test_a_finished_run_stays_finished_until_its_record_expires(
    later: list[tuple[int, str]], status: RunStatus
) -> None:
    record = decisions.claim(None, request(0), START).record
    record = act(record, "complete" if status is RunStatus.COMPLETED else "fail", START)
    now = START
    for attempt, (millis, _) in enumerate(later, start=1):
        now += timedelta(milliseconds=millis)
        answer = decisions.claim(record, request(attempt), now)
        if not decisions.is_live(record, now):
            break  # Past retention the record counts as absent: a new run may start.
        assert answer.verdict is FINISHED[status]
        assert answer.record == record


MARGIN_US = int(c.LOCK_TOKEN_MARGIN.total_seconds() * 1e6)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=3_600_000),  # ms the true time moves on
            st.booleans(),  # whether a store purges the lapsed record before the next grant
            st.integers(
                min_value=0, max_value=MARGIN_US - 1
            ),  # how far behind the grant's clock is
        ),
        min_size=1,
        max_size=20,
    )
)
def test_a_lock_token_grows_for_the_life_of_its_key_whatever_is_purged(
    history: list[tuple[int, bool, int]],
) -> None:
    lock: LockRecord | None = None
    true_now = START
    seen = 0
    for index, (gap_ms, purge, behind_us) in enumerate(history):
        true_now += timedelta(milliseconds=gap_ms)
        if purge and lock is not None and locking.lapses_at(lock) <= true_now:
            lock = None  # Deleted as soon as a store may: nothing remembers its token.
        clock = true_now - timedelta(microseconds=behind_us)
        asked = LockRequest(name="job", run_id=f"run-{index}", attempt_id=f"a-{index}", lease=LEASE)
        grant = locking.acquire(lock, asked, clock)
        if not grant.acquired:
            continue  # A clock behind the last start still sees the lock taken: no grant.
        assert grant.lock.fencing_token > seen
        seen = grant.lock.fencing_token
        lock = locking.released(grant.lock, clock)
