"""The lock rules and the skip/yield decisions, without any store."""

from __future__ import annotations

from datetime import timedelta

from tasklease.testing.contract_support import HOUR, LEASE, lock_request
from tasklease.worker.core import decisions, locking
from tasklease.worker.core.constants import LOCK_TOKEN_MARGIN, MAX_CLOCK_SKEW
from tasklease.worker.core.records import RunStatus, Verdict
from tests.support.helpers import T0, claim_request


def test_a_live_holder_is_busy_until_the_later_of_its_lease_and_its_safety_expiry() -> None:
    lock = locking.acquire(None, lock_request(), T0).lock
    assert locking.busy_until(lock, "run-b", T0) == T0 + HOUR
    short = locking.acquire(None, lock_request(max_runtime=None), T0).lock
    assert locking.busy_until(short, "run-b", T0) == T0 + LEASE + MAX_CLOCK_SKEW
    assert locking.busy_until(lock, "run-a", T0) is None  # Its own run is never kept out.


def test_a_released_lock_lapses_at_min_gap_after_its_start() -> None:
    lock = locking.acquire(None, lock_request(min_gap=timedelta(minutes=5)), T0).lock
    released = locking.released(lock, T0 + timedelta(minutes=1))
    assert locking.busy_until(released, "run-b", T0 + timedelta(minutes=1)) == T0 + timedelta(
        minutes=5
    )
    assert locking.lapses_at(released) == T0 + timedelta(minutes=5)


def test_a_skipped_run_is_settled_and_names_the_holder() -> None:
    claimed = decisions.claim(None, claim_request(), T0).record
    skipped = decisions.skipped(claimed, "run-a", "job/nightly", T0)
    assert skipped.status is RunStatus.SKIPPED
    assert skipped.result == {"held_by": "run-a", "lock": "job/nightly"}
    assert decisions.decide(skipped, T0 + LEASE * 2) is Verdict.SKIPPED


def test_a_yielded_claim_is_claimable_at_once_and_does_not_count_as_an_attempt() -> None:
    claimed = decisions.claim(None, claim_request(), T0).record
    yielded = decisions.yielded(claimed, "key busy", T0)
    assert (yielded.status, yielded.attempts) == (RunStatus.RELEASED, 0)
    again = decisions.claim(yielded, claim_request(attempt_id="attempt-2"), T0)
    assert again.verdict is Verdict.CLAIMED
    assert (again.record.attempts, again.record.fencing_token) == (1, 2)


def test_a_token_is_one_more_than_the_last_and_at_least_the_grant_time_in_microseconds() -> None:
    first = locking.acquire(None, lock_request(), T0).lock
    assert first.fencing_token == locking.token_floor(T0)
    assert locking.token_time(first.fencing_token) == T0
    same_instant = locking.acquire(locking.released(first, T0), lock_request("run-b", "b1"), T0)
    assert same_instant.lock.fencing_token == first.fencing_token + 1
    older = first.replace(fencing_token=3)  # Written before tokens followed the clock.
    assert locking.next_token(older, T0) == locking.token_floor(T0)


def test_a_lock_lapses_no_sooner_than_the_token_margin_after_its_token_time() -> None:
    lock = locking.acquire(None, lock_request(max_runtime=None), T0).lock
    released = locking.released(lock, T0)
    assert locking.lapses_at(released) == T0 + LOCK_TOKEN_MARGIN
    # A grant then, on a clock up to the margin behind, still outranks the deleted token.
    late = T0 + LOCK_TOKEN_MARGIN - timedelta(seconds=59)
    assert locking.next_token(None, late) > lock.fencing_token


def test_a_holder_that_ended_its_own_run_holds_nothing_but_min_gap_still_counts() -> None:
    lock = locking.acquire(None, lock_request(min_gap=timedelta(minutes=5)), T0).lock
    claimed = decisions.claim(None, claim_request("run-a", "a1"), T0).record
    assert locking.needs_holder(lock, "run-b", T0)
    assert not locking.holder_finished(lock, claimed)
    done = decisions.completed(claimed, None, T0 + timedelta(minutes=1))
    assert locking.holder_finished(lock, done)
    other_attempt = done.replace(attempt_id="a2")  # Ended by another attempt: a1 may run on.
    assert not locking.holder_finished(lock, other_attempt)
    at = T0 + timedelta(minutes=2)
    assert locking.busy_until(lock, "run-b", at, done) == T0 + timedelta(minutes=5)
    assert locking.state(lock, done, at) is locking.LockState.GAP
    later = T0 + timedelta(minutes=5)
    grant = locking.acquire(lock, lock_request("run-b", "b1"), later, done)
    assert (grant.acquired, grant.took_over_from) == (True, None)


def test_an_attempt_whose_claim_passed_on_is_refused_its_runs_lock() -> None:
    lock = locking.acquire(None, lock_request("run-a", "a2"), T0).lock
    taken_over = decisions.claim(None, claim_request("run-a", "a2"), T0).record
    stale = lock_request("run-a", "a1")
    later = T0 + timedelta(seconds=1)

    assert locking.needs_holder(lock, "run-a", later)  # Its own run's record decides.
    assert locking.claim_passed_on(lock, stale, taken_over)
    refused = locking.acquire(lock, stale, later, taken_over)
    assert (refused.acquired, refused.lock) == (False, lock)
    assert refused.free_at == T0 + HOUR  # When the holder's max_runtime ends.
    # The attempt holding the run's claim takes its earlier attempt's lock over, as before.
    own = decisions.claim(None, claim_request("run-a", "a3"), T0).record
    assert locking.acquire(lock, lock_request("run-a", "a3"), later, own).acquired
    assert locking.acquire(lock, lock_request("run-a", "a3"), later, None).acquired
    assert not locking.claim_passed_on(lock, stale, None)  # No record: nothing to go by.


def test_an_operator_release_needs_force_only_for_a_live_holder() -> None:
    lock = locking.acquire(None, lock_request(), T0).lock
    refused = locking.operator_release(lock, None, T0 + LEASE / 2)
    assert refused.outcome is locking.LockReleaseOutcome.HOLDER_LIVE
    assert refused.live_until == T0 + LEASE + MAX_CLOCK_SKEW
    forced = locking.operator_release(lock, None, T0 + LEASE / 2, force=True)
    assert (forced.outcome, forced.forced) == (locking.LockReleaseOutcome.RELEASED, True)
    assert forced.lock is not None
    assert locking.state(forced.lock, None, T0 + LEASE / 2) is locking.LockState.FREE
    silent = T0 + LEASE * 2  # Its lease lapsed; max_runtime still keeps others out.
    assert locking.state(lock, None, silent) is locking.LockState.SILENT
    unforced = locking.operator_release(lock, None, silent)
    assert (unforced.outcome, unforced.forced) == (locking.LockReleaseOutcome.RELEASED, False)
    assert locking.operator_release(None, None, T0).outcome is locking.LockReleaseOutcome.MISSING
