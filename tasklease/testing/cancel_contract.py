"""Cancellation in the store contract: :meth:`LeaseStore.cancel_run` ends a run nothing runs
at once and marks a held one, which its holder learns of from the records its renewals and
steps return (:meth:`LeaseStore.renew_run`, :meth:`LeaseStore.record_step`) and ends with
:meth:`LeaseStore.end_cancelled`; a mark whose holder is gone is ended by the next cancel."""

from __future__ import annotations

from datetime import timedelta

from tasklease.testing.contract_support import EXPIRED, LEASE, T0, claim_request
from tasklease.worker.core.cancellation import CancelOutcome
from tasklease.worker.core.records import RunStatus, Verdict
from tasklease.worker.core.steps import StepRecord
from tasklease.worker.stores.base.store import LeaseStore

BY = "operator@example.com"
SECOND = timedelta(seconds=1)


class CancelContract:
    """Semantics of :meth:`LeaseStore.cancel_run`, :meth:`LeaseStore.end_cancelled` and
    :meth:`LeaseStore.renew_run`."""

    def test_a_released_run_is_cancelled_at_once_and_never_claimed_again(
        self, store: LeaseStore
    ) -> None:
        store.claim(claim_request(), T0)
        assert store.release("run-1", "attempt-1", "boom", T0)
        decision = store.cancel_run("run-1", BY, T0 + SECOND)
        assert decision.outcome is CancelOutcome.CANCELLED
        record = store.get("run-1")
        assert record is not None and record == decision.record
        assert (record.status, record.cancelled_by, record.cancelled_at) == (
            RunStatus.CANCELLED,
            BY,
            T0 + SECOND,
        )
        assert record.finished_at == T0 + SECOND and record.error == f"cancelled by {BY}"
        claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + 2 * SECOND)
        assert claim.verdict is Verdict.CANCELLED
        assert store.get("run-1") == record
        again = store.cancel_run("run-1", "someone else", T0 + 3 * SECOND)
        assert again.outcome is CancelOutcome.ALREADY and store.get("run-1") == record

    def test_a_held_run_is_marked_and_its_holder_learns_it_from_a_renewal_or_a_step(
        self, store: LeaseStore
    ) -> None:
        store.claim(claim_request(), T0)
        # Remembered by a conditional store: the mark must still reach the holder's next write.
        assert store.renew("run-1", "attempt-1", LEASE, T0 + SECOND) is not None
        decision = store.cancel_run("run-1", BY, T0 + 2 * SECOND)
        assert decision.outcome is CancelOutcome.STOPPING
        marked = store.get("run-1")
        assert marked is not None and marked.status is RunStatus.IN_PROGRESS
        assert (marked.cancelled_by, marked.cancelled_at) == (BY, T0 + 2 * SECOND)
        renewed = store.renew_run("run-1", "attempt-1", LEASE, T0 + 3 * SECOND)
        assert renewed is not None and renewed.lease_expires == T0 + 3 * SECOND + LEASE
        assert (renewed.cancelled_by, renewed.cancelled_at) == (BY, T0 + 2 * SECOND)
        assert renewed == store.get("run-1")
        step = StepRecord("charge", '"ok"', "attempt-1", T0 + 4 * SECOND, 4)
        stepped = store.record_step("run-1", "attempt-1", step)
        assert stepped is not None and stepped.cancelled_at == T0 + 2 * SECOND
        other = store.claim(claim_request(attempt_id="attempt-2"), T0 + 5 * SECOND)
        assert other.verdict is Verdict.IN_PROGRESS  # Its holder ends it, nobody else.
        assert store.cancel_run("run-1", "someone else", T0 + 5 * SECOND).outcome is (
            CancelOutcome.ALREADY
        )
        assert store.end_cancelled("run-1", "attempt-1", T0 + 6 * SECOND)
        ended = store.get("run-1")
        assert ended is not None
        assert (ended.status, ended.cancelled_by, ended.finished_at) == (
            RunStatus.CANCELLED,
            BY,
            T0 + 6 * SECOND,
        )
        assert ended.lease_expires <= T0 + 6 * SECOND
        # A retried call whose first try landed is recognised; a stale attempt's is refused.
        assert store.end_cancelled("run-1", "attempt-1", T0 + 7 * SECOND)
        assert not store.end_cancelled("run-1", "attempt-2", T0 + 7 * SECOND)
        assert store.renew_run("run-1", "attempt-1", LEASE, T0 + 8 * SECOND) is None
        assert store.get("run-1") == ended

    def test_a_mark_whose_holder_died_is_ended_by_the_next_cancel_and_refuses_claims(
        self, store: LeaseStore
    ) -> None:
        store.claim(claim_request(), T0)
        assert store.cancel_run("run-1", BY, T0 + SECOND).outcome is CancelOutcome.STOPPING
        lapsed = T0 + SECOND + EXPIRED
        assert store.claim(claim_request(attempt_id="attempt-2"), lapsed).verdict is (
            Verdict.CANCELLED
        )
        decision = store.cancel_run("run-1", "a retry", lapsed)
        assert decision.outcome is CancelOutcome.ALREADY
        record = store.get("run-1")
        assert record is not None and record == decision.record
        assert (record.status, record.cancelled_by, record.cancelled_at) == (
            RunStatus.CANCELLED,
            BY,
            T0 + SECOND,
        )
        assert store.renew_run("run-1", "attempt-1", LEASE, lapsed) is None

    def test_a_waiting_run_is_cancelled_at_once(self, store: LeaseStore) -> None:
        store.claim(claim_request(), T0)
        assert store.suspend("run-1", "attempt-1", None, '{"order":7}', T0) is not None
        decision = store.cancel_run("run-1", BY, T0 + SECOND)
        assert decision.outcome is CancelOutcome.CANCELLED
        record = store.get("run-1")
        assert record is not None and record.status is RunStatus.CANCELLED
        assert record.payload is None  # Kept for its resume only.

    def test_an_ended_or_unknown_run_is_not_cancelled(self, store: LeaseStore) -> None:
        store.claim(claim_request(), T0)
        assert store.complete("run-1", "attempt-1", '{"sent":true}', T0)
        completed = store.get("run-1")
        decision = store.cancel_run("run-1", BY, T0 + SECOND)
        assert decision.outcome is CancelOutcome.ENDED and not decision.outcome.accepted
        assert store.get("run-1") == completed
        missing = store.cancel_run("no-such-run", BY, T0)
        assert missing.outcome is CancelOutcome.MISSING and missing.record is None
        assert store.get("no-such-run") is None
        past = store.cancel_run("run-1", BY, T0 + timedelta(days=8))  # Past its retention.
        assert past.outcome is CancelOutcome.MISSING

    def test_a_run_ended_cancelled_for_its_parent_names_the_parent(self, store: LeaseStore) -> None:
        store.claim(claim_request(), T0)
        by = "the cancellation of its parent run p-1"
        assert store.end_cancelled("run-1", "attempt-1", T0 + SECOND, by=by)
        record = store.get("run-1")
        assert record is not None
        assert (record.status, record.cancelled_by, record.cancelled_at) == (
            RunStatus.CANCELLED,
            by,
            T0 + SECOND,
        )
