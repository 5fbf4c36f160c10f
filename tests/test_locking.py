"""The lock rules and the skip/yield decisions, without any store."""

from __future__ import annotations

from datetime import timedelta

from tasklease.worker import decisions, locking
from tasklease.worker.constants import MAX_CLOCK_SKEW
from tasklease.worker.records import RunStatus, Verdict
from tests.helpers import T0, claim_request
from tests.store_contract import HOUR, LEASE, lock_request


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
