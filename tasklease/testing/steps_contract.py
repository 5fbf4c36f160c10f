"""Durable steps in the store contract: a run's steps are kept in its record, written by the
attempt holding the claim only, carried across claims, capped, and purged with the run."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tasklease.testing.contract_support import EXPIRED, LEASE, T0, claim_request
from tasklease.worker.core import steps
from tasklease.worker.core.records import RunStatus, Verdict
from tasklease.worker.core.steps import StepError, StepRecord
from tasklease.worker.stores.base.store import LeaseStore


def _step(name: str, result_json: str, attempt_id: str = "attempt-1") -> StepRecord:
    return StepRecord(name, result_json, attempt_id, T0, len(result_json))


class StepsContract:
    """Semantics of :meth:`LeaseStore.record_step` and :meth:`LeaseStore.continue_run`."""

    def test_a_recorded_step_comes_back_with_the_next_claim_in_order(
        self, store: LeaseStore
    ) -> None:
        store.claim(claim_request(), T0)
        assert store.record_step("run-1", "attempt-1", _step("charge", '{"id":7}')) is not None
        assert store.record_step("run-1", "attempt-1", _step("email", '"sent"')) is not None
        store.release("run-1", "attempt-1", "boom", T0)
        claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + timedelta(seconds=1))
        assert claim.verdict is Verdict.CLAIMED
        recorded = steps.steps_of(claim.record)
        assert list(recorded) == ["charge", "email"]
        assert recorded["charge"].result == {"id": 7}
        assert (recorded["charge"].attempt_id, recorded["charge"].completed_at) == ("attempt-1", T0)

    def test_a_stale_attempts_step_is_refused_and_the_new_attempts_stand(
        self, store: LeaseStore
    ) -> None:
        store.claim(claim_request(), T0)
        store.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)
        assert store.record_step("run-1", "attempt-2", _step("a", "2", "attempt-2")) is not None
        assert store.record_step("run-1", "attempt-1", _step("a", "1")) is None
        assert store.record_step("run-1", "attempt-1", _step("b", "1")) is None
        record = store.get("run-1")
        assert record is not None
        assert {n: s.result for n, s in steps.steps_of(record).items()} == {"a": 2}

    def test_a_retried_step_write_that_landed_changes_nothing(self, store: LeaseStore) -> None:
        store.claim(claim_request(), T0)
        first = store.record_step("run-1", "attempt-1", _step("a", "1"))
        again = store.record_step("run-1", "attempt-1", _step("a", "1"))
        assert first is not None and again is not None
        assert again.steps_json == first.steps_json

    def test_steps_stay_with_the_completed_run_and_are_purged_with_it(
        self, store: LeaseStore
    ) -> None:
        store.claim(claim_request(retention=timedelta(hours=1)), T0)
        store.record_step("run-1", "attempt-1", _step("a", "1"))
        store.complete("run-1", "attempt-1", None, T0)
        record = store.get("run-1")
        assert record is not None and record.status is RunStatus.COMPLETED
        assert list(steps.steps_of(record)) == ["a"]
        store.purge_expired(T0 + timedelta(hours=2))
        assert store.get("run-1") is None

    def test_a_record_past_retention_gives_the_next_claim_no_steps(self, store: LeaseStore) -> None:
        store.claim(claim_request(retention=timedelta(minutes=1)), T0)
        store.record_step("run-1", "attempt-1", _step("a", "1"))
        store.release("run-1", "attempt-1", "boom", T0)
        later = T0 + LEASE + timedelta(days=1)
        claim = store.claim(claim_request(attempt_id="attempt-2"), later)
        assert claim.verdict is Verdict.CLAIMED
        assert steps.steps_of(claim.record) == {}

    def test_the_run_cap_refuses_a_step_with_a_clear_error(self, store: LeaseStore) -> None:
        store.claim(claim_request(), T0)
        big = '"' + "x" * (steps.MAX_STEP_RESULT_BYTES - 2) + '"'
        store.record_step("run-1", "attempt-1", _step("one", big))
        with pytest.raises(StepError, match=r"'two'.*per-run cap"):
            store.record_step("run-1", "attempt-1", _step("two", big))
        record = store.get("run-1")
        assert record is not None and list(steps.steps_of(record)) == ["one"]

    def test_a_delayed_continuation_keeps_the_run_past_its_delay_and_the_retention(
        self, store: LeaseStore
    ) -> None:
        keep = timedelta(hours=2)
        store.claim(claim_request(retention=keep), T0)
        later = steps.Continuation(1, {"cursor": 5}, T0, timedelta(hours=3).total_seconds())
        assert store.continue_run(
            "run-1", "attempt-1", steps.encode_continuation(later), T0, keep_for=keep
        )
        due = T0 + timedelta(hours=3)
        # A late duplicate of the first delivery claims (and yields) during the delay: its
        # claim, kept only its retention past now, must not bring the expiry forward.
        duplicate = store.claim(claim_request(attempt_id="dup", retention=keep), T0 + keep)
        assert duplicate.verdict is Verdict.CLAIMED
        assert store.yield_claim("run-1", "dup", "superseded", T0 + keep)
        last_moment = due + keep - timedelta(seconds=1)
        assert store.purge_expired(last_moment) == 0
        claim = store.claim(claim_request(attempt_id="attempt-2", retention=keep), last_moment)
        assert claim.verdict is Verdict.CLAIMED
        assert steps.continuation_of(claim.record).state == {"cursor": 5}

    def test_a_continuation_releases_the_run_with_its_state_kept_and_its_steps_dropped(
        self, store: LeaseStore
    ) -> None:
        store.claim(claim_request(), T0)
        store.record_step("run-1", "attempt-1", _step("a", "1"))
        state = steps.encode_continuation(steps.Continuation(1, {"cursor": 5}, T0))
        assert store.continue_run("run-1", "attempt-1", state, T0)
        assert store.continue_run("run-1", "attempt-1", state, T0)  # A retried write landed.
        record = store.get("run-1")
        assert record is not None and record.status is RunStatus.RELEASED
        claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + timedelta(seconds=1))
        assert claim.verdict is Verdict.CLAIMED
        assert steps.continuation_of(claim.record).state == {"cursor": 5}
        assert steps.continuation_of(claim.record).seq == 1
        assert steps.steps_of(claim.record) == {}  # The continued delivery's were final.
        assert not store.continue_run("run-1", "attempt-1", state, T0)  # Stale: refused.
