"""The lock part of the store contract: what a :class:`~tasklease.worker.stores.LockStore`
must do for exclusive jobs, concurrency keys and ``tasklease locks``."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from tasklease.testing.contract_support import EXPIRED, HOUR, LEASE, T0, claim_request, lock_request
from tasklease.worker.core import locking
from tasklease.worker.core.constants import MAX_CLOCK_SKEW
from tasklease.worker.core.locking import LockReleaseOutcome, token_floor
from tasklease.worker.stores.base.locks import LockStore


class LockContract:
    """Semantics every :class:`LockStore` must have (with a ``store`` fixture)."""

    def test_a_lock_is_kept_from_other_runs_while_its_holder_lives(self, store: LockStore) -> None:
        first = store.acquire_lock(lock_request(), T0)
        assert first.acquired
        assert (first.lock.holder_run_id, first.lock.fencing_token) == ("run-a", token_floor(T0))
        assert store.get_lock("job/nightly") == first.lock
        other = store.acquire_lock(lock_request("run-b", "b1"), T0 + LEASE)
        assert not other.acquired
        assert other.lock.holder_run_id == "run-a"
        assert other.free_at == T0 + HOUR
        assert store.get_lock("job/nightly") == first.lock

    def test_a_crashed_holder_keeps_the_lock_until_max_runtime_then_it_is_taken_over(
        self, store: LockStore
    ) -> None:
        store.acquire_lock(lock_request(), T0)
        assert not store.acquire_lock(lock_request("run-b", "b1"), T0 + HOUR / 2).acquired
        taken = store.acquire_lock(lock_request("run-b", "b1"), T0 + HOUR)
        assert taken.acquired
        assert taken.took_over_from == "run-a"
        assert taken.lock.fencing_token == token_floor(T0 + HOUR)
        # The crashed holder's late finish is fenced.
        assert not store.release_lock("job/nightly", "a1", T0 + HOUR)
        assert store.renew_lock("job/nightly", "a1", LEASE, T0 + HOUR) is None
        assert store.get_lock("job/nightly") == taken.lock

    def test_a_holder_renewing_past_max_runtime_keeps_the_lock(self, store: LockStore) -> None:
        store.acquire_lock(lock_request(), T0)
        moment = T0
        while moment < T0 + 2 * HOUR:
            moment += LEASE / 3
            assert store.renew_lock("job/nightly", "a1", LEASE, moment) == moment + LEASE
        assert not store.acquire_lock(lock_request("run-b", "b1"), moment).acquired
        # Once it stops renewing, its lease alone holds the lock (max_runtime has passed).
        assert store.acquire_lock(lock_request("run-b", "b1"), moment + EXPIRED).acquired

    def test_a_released_lock_is_free_at_once_except_within_min_gap_of_the_last_start(
        self, store: LockStore
    ) -> None:
        gap = timedelta(minutes=5)
        store.acquire_lock(lock_request(min_gap=gap), T0)
        assert store.release_lock("job/nightly", "a1", T0 + timedelta(minutes=1))
        assert store.release_lock("job/nightly", "a1", T0 + timedelta(minutes=1)), "retried"
        early = store.acquire_lock(lock_request("run-b", "b1"), T0 + timedelta(minutes=2))
        assert (early.acquired, early.free_at) == (False, T0 + gap)
        assert early.lock.holder_run_id == "run-a"
        later = store.acquire_lock(lock_request("run-b", "b1"), T0 + gap)
        assert later.acquired
        assert later.took_over_from is None

    def test_an_acquisition_retried_after_it_landed_is_recognised(self, store: LockStore) -> None:
        first = store.acquire_lock(lock_request(), T0)
        again = store.acquire_lock(lock_request(), T0 + timedelta(seconds=1))
        assert again.acquired
        assert again.lock == first.lock

    def test_another_attempt_of_the_holding_run_takes_the_lock_over(self, store: LockStore) -> None:
        store.acquire_lock(lock_request(), T0)
        retry = store.acquire_lock(lock_request("run-a", "a2"), T0 + EXPIRED)
        assert retry.acquired
        assert (retry.lock.holder_attempt_id, retry.lock.fencing_token) == (
            "a2",
            token_floor(T0 + EXPIRED),
        )
        assert not store.release_lock("job/nightly", "a1", T0 + EXPIRED)

    def test_an_attempt_whose_claim_passed_on_cannot_take_the_lock_back(
        self, store: LockStore
    ) -> None:
        """An attempt's acquisition that lands once another attempt of its run took the run
        and the lock over (held up on its way, or sent after a stall) is refused: granted, it
        would take the lock from the attempt now running, and its release would free the lock
        for another run while that attempt still works."""
        store.claim(claim_request("run-a", "a1"), T0)
        assert store.acquire_lock(lock_request(), T0).acquired
        store.claim(claim_request("run-a", "a2"), T0 + EXPIRED)
        successor = store.acquire_lock(lock_request("run-a", "a2"), T0 + EXPIRED)
        assert successor.acquired and successor.lock.holder_attempt_id == "a2"
        late = T0 + EXPIRED + timedelta(seconds=1)
        stale = store.acquire_lock(lock_request("run-a", "a1"), late)
        assert not stale.acquired
        assert stale.lock == successor.lock == store.get_lock("job/nightly")
        assert not store.release_lock("job/nightly", "a1", late)
        assert not store.acquire_lock(lock_request("run-b", "b1"), late).acquired
        assert store.release_lock("job/nightly", "a2", late)

    def test_purge_deletes_locks_that_decide_nothing_any_more(self, store: LockStore) -> None:
        store.acquire_lock(lock_request(name="key/a"), T0)
        store.acquire_lock(lock_request(name="key/b", max_runtime=None), T0)
        store.release_lock("key/b", "a1", T0)
        assert store.purge_expired(T0 + EXPIRED) == 1
        assert store.get_lock("key/b") is None
        assert store.get_lock("key/a") is not None

    def test_a_lock_token_grows_by_one_when_the_clock_has_not_moved(self, store: LockStore) -> None:
        first = store.acquire_lock(lock_request(), T0).lock
        assert store.release_lock("job/nightly", "a1", T0)
        second = store.acquire_lock(lock_request("run-b", "b1"), T0).lock
        assert second.fencing_token == first.fencing_token + 1

    def test_a_lock_token_grows_past_a_purge_of_the_lapsed_lock(self, store: LockStore) -> None:
        tokens = []
        for index in range(3):
            moment = T0 + timedelta(seconds=index)
            granted = store.acquire_lock(lock_request(f"run-{index}", f"a{index}"), moment)
            tokens.append(granted.lock.fencing_token)
            assert store.release_lock("job/nightly", f"a{index}", moment)
        last = store.get_lock("job/nightly")
        assert last is not None
        lapsed = locking.lapses_at(last)
        assert store.purge_expired(lapsed) == 1
        assert store.get_lock("job/nightly") is None
        # Granted again on a fresh record, from a clock MAX_CLOCK_SKEW behind the purge's.
        again = store.acquire_lock(lock_request("run-9", "a9"), lapsed - MAX_CLOCK_SKEW)
        assert tokens == sorted(set(tokens))
        assert again.lock.fencing_token > tokens[-1]

    def test_a_lock_whose_holder_ended_its_run_is_free_although_never_released(
        self, store: LockStore
    ) -> None:
        for index, end in enumerate(("complete", "fail", "release")):
            name, run, attempt = f"job/{end}", f"run-{end}", f"a-{end}"
            store.claim(claim_request(run, attempt), T0)
            assert store.acquire_lock(lock_request(run, attempt, name), T0).acquired
            later = T0 + timedelta(seconds=index + 1)
            if end == "complete":
                assert store.complete(run, attempt, None, later)
            elif end == "fail":
                assert store.fail(run, attempt, "PermanentFailure: bad", later)
            else:
                assert store.release(run, attempt, "RuntimeError: boom", later)
            # Its lock release was lost: the lock still names it, unreleased.
            stored = store.get_lock(name)
            assert stored is not None
            assert not stored.released
            grant = store.acquire_lock(lock_request("run-next", "n1", name), later)
            assert grant.acquired, f"{end}: a finished holder kept the lock"
            assert grant.took_over_from is None
            assert grant.lock.fencing_token > stored.fencing_token
            assert not store.release_lock(name, attempt, later)  # The old holder is fenced.

    def test_a_lock_stays_held_while_its_holders_run_is_in_progress_or_ended_by_another(
        self, store: LockStore
    ) -> None:
        store.claim(claim_request("run-a", "a1"), T0)
        store.acquire_lock(lock_request(), T0)
        assert not store.acquire_lock(lock_request("run-b", "b1"), T0 + LEASE / 2).acquired
        # Another attempt of run-a took the run over and finished it: the holder, attempt a1,
        # may still be running unheard, so max_runtime still keeps run-b out.
        store.claim(claim_request("run-a", "a2"), T0 + EXPIRED)
        assert store.complete("run-a", "a2", None, T0 + EXPIRED)
        busy = store.acquire_lock(lock_request("run-b", "b1"), T0 + EXPIRED)
        assert (busy.acquired, busy.free_at) == (False, T0 + HOUR)

    def test_twenty_runs_racing_for_one_lock_one_acquires_it(self, store: LockStore) -> None:
        start = threading.Barrier(20)

        def race(index: int) -> bool:
            start.wait()
            return store.acquire_lock(lock_request(f"run-{index}", f"a{index}"), T0).acquired

        with ThreadPoolExecutor(20) as pool:
            won = list(pool.map(race, range(20)))
        assert won.count(True) == 1
        lock = store.get_lock("job/nightly")
        assert lock is not None
        assert lock.holder_run_id == f"run-{won.index(True)}"

    # Locks: `tasklease locks list` and `tasklease locks release`.

    def test_locks_are_listed_latest_start_first(self, store: LockStore) -> None:
        assert store.list_locks() == []
        for index in range(3):
            store.acquire_lock(
                lock_request(f"run-{index}", f"a{index}", f"key/{index}"),
                T0 + timedelta(seconds=index),
            )
        assert [lock.name for lock in store.list_locks()] == ["key/2", "key/1", "key/0"]
        assert [lock.name for lock in store.list_locks(limit=2)] == ["key/2", "key/1"]

    def test_lock_release_refuses_a_running_holder_unless_forced(self, store: LockStore) -> None:
        store.claim(claim_request("run-a", "a1"), T0)
        held = store.acquire_lock(lock_request(), T0).lock
        decision = store.operator_release_lock("job/nightly", T0 + timedelta(seconds=30))
        assert decision.outcome is LockReleaseOutcome.HOLDER_LIVE
        assert decision.live_until == T0 + EXPIRED
        assert store.get_lock("job/nightly") == held
        forced = store.operator_release_lock("job/nightly", T0 + LEASE / 2, force=True)
        assert (forced.outcome, forced.forced) == (LockReleaseOutcome.RELEASED, True)
        stored = store.get_lock("job/nightly")
        assert stored is not None
        assert stored.released
        # The holder is fenced out of the lock: its renewal fails, so it loses its lease.
        assert store.renew_lock("job/nightly", "a1", LEASE, T0 + LEASE / 2) is None
        grant = store.acquire_lock(lock_request("run-b", "b1"), T0 + LEASE / 2)
        assert grant.acquired
        assert grant.lock.fencing_token > held.fencing_token

    def test_lock_release_of_a_silent_holder_needs_no_force(self, store: LockStore) -> None:
        store.acquire_lock(lock_request(), T0)  # Then its process died: nothing renews.
        assert not store.acquire_lock(lock_request("run-b", "b1"), T0 + EXPIRED).acquired
        decision = store.operator_release_lock("job/nightly", T0 + EXPIRED)
        assert (decision.outcome, decision.forced) == (LockReleaseOutcome.RELEASED, False)
        assert store.acquire_lock(lock_request("run-b", "b1"), T0 + EXPIRED).acquired

    def test_lock_release_lifts_min_gap_and_leaves_a_free_lock_alone(
        self, store: LockStore
    ) -> None:
        gap = timedelta(minutes=30)
        store.acquire_lock(lock_request(min_gap=gap), T0)
        assert store.release_lock("job/nightly", "a1", T0 + timedelta(minutes=1))
        lifted = store.operator_release_lock("job/nightly", T0 + timedelta(minutes=2))
        assert lifted.outcome is LockReleaseOutcome.RELEASED
        free = store.operator_release_lock("job/nightly", T0 + timedelta(minutes=2))
        assert free.outcome is LockReleaseOutcome.ALREADY_FREE
        assert store.acquire_lock(lock_request("run-b", "b1"), T0 + timedelta(minutes=2)).acquired
        missing = store.operator_release_lock("job/none", T0)
        assert (missing.outcome, missing.lock) == (LockReleaseOutcome.MISSING, None)

    def test_a_lock_whose_holder_ended_its_run_is_already_free(self, store: LockStore) -> None:
        store.claim(claim_request("run-a", "a1"), T0)
        store.acquire_lock(lock_request(), T0)
        assert store.complete("run-a", "a1", None, T0 + timedelta(seconds=5))
        decision = store.operator_release_lock("job/nightly", T0 + timedelta(seconds=6))
        assert decision.outcome is LockReleaseOutcome.ALREADY_FREE
