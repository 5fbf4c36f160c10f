"""The transactional step contract: the tests a store implementing
:meth:`~tasklease.worker.stores.TransactionalStore.record_step_in_transaction` passes, so
that a step's writes and its record commit together, only for the attempt holding the claim.

Its fixtures are the transaction contract's (:mod:`.transaction_contract`): ``store``,
``write_effect`` and ``count_effects``::

    class TestMyStoreTransactionalSteps(TransactionalStepContract):
        ...  # the same three fixtures
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tasklease.testing.contract_support import EXPIRED, LEASE, T0, claim_request
from tasklease.testing.transaction_contract import Boom, CountEffects, WriteEffect
from tasklease.worker.core import decisions, steps
from tasklease.worker.core.records import RunStatus
from tasklease.worker.core.steps import StepError, StepRecord
from tasklease.worker.stores.base.transactional import StepWork, TransactionalStore


def _work(write_effect: WriteEffect, key: str, name: str, result_json: str = "1") -> StepWork:
    def work(tx: Any) -> StepRecord:
        write_effect(tx, key)
        return StepRecord(name, result_json, "attempt-1", T0, len(result_json))

    return work


class TransactionalStepContract:
    """Semantics of :meth:`TransactionalStore.record_step_in_transaction`."""

    def test_a_steps_writes_and_its_record_commit_together(
        self, store: TransactionalStore, write_effect: WriteEffect, count_effects: CountEffects
    ) -> None:
        store.claim(claim_request(), T0)
        work = _work(write_effect, "debit", "debit", '{"id":7}')
        outcome = store.record_step_in_transaction("run-1", "attempt-1", work, T0)
        assert (outcome.held, outcome.result_json) == (True, '{"id":7}')
        assert count_effects("debit") == 1
        record = store.get("run-1")
        assert record is not None and record.status is RunStatus.IN_PROGRESS
        recorded = steps.steps_of(record)
        assert (recorded["debit"].result, recorded["debit"].attempt_id) == ({"id": 7}, "attempt-1")
        # The attempt still holds the claim: it renews, records more steps, completes.
        assert store.renew("run-1", "attempt-1", LEASE, T0) is not None
        second = store.record_step_in_transaction(
            "run-1", "attempt-1", _work(write_effect, "credit", "credit"), T0
        )
        assert second.held
        assert store.complete("run-1", "attempt-1", None, T0)
        done = store.get("run-1")
        assert done is not None and list(steps.steps_of(done)) == ["debit", "credit"]

    def test_step_work_that_raises_keeps_nothing_and_the_claim_stays_held(
        self, store: TransactionalStore, write_effect: WriteEffect, count_effects: CountEffects
    ) -> None:
        store.claim(claim_request(), T0)

        def work(tx: Any) -> StepRecord:
            write_effect(tx, "debit")
            raise Boom("after the write")

        with pytest.raises(Boom):
            store.record_step_in_transaction("run-1", "attempt-1", work, T0)
        assert count_effects("debit") == 0
        record = store.get("run-1")
        assert decisions.holds(record, "attempt-1")
        assert record is not None and steps.steps_of(record) == {}

    def test_a_stale_attempts_step_commits_nothing(
        self, store: TransactionalStore, write_effect: WriteEffect, count_effects: CountEffects
    ) -> None:
        store.claim(claim_request(), T0)
        store.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)
        work = _work(write_effect, "debit", "debit")
        outcome = store.record_step_in_transaction("run-1", "attempt-1", work, T0 + EXPIRED)
        assert (outcome.held, outcome.result_json) == (False, None)
        assert count_effects("debit") == 0
        record = store.get("run-1")
        assert decisions.holds(record, "attempt-2")
        assert record is not None and steps.steps_of(record) == {}

    def test_a_released_attempts_step_commits_nothing(
        self, store: TransactionalStore, write_effect: WriteEffect, count_effects: CountEffects
    ) -> None:
        store.claim(claim_request(), T0)
        assert store.release("run-1", "attempt-1", "gave up", T0)
        work = _work(write_effect, "debit", "debit")
        assert not store.record_step_in_transaction("run-1", "attempt-1", work, T0).held
        assert count_effects("debit") == 0

    def test_a_step_past_the_runs_cap_is_refused_with_none_of_its_writes(
        self, store: TransactionalStore, write_effect: WriteEffect, count_effects: CountEffects
    ) -> None:
        store.claim(claim_request(), T0)
        big = json.dumps("x" * (steps.MAX_STEP_RESULT_BYTES - 16))
        first = _work(write_effect, "one", "one", big)
        assert store.record_step_in_transaction("run-1", "attempt-1", first, T0).held
        with pytest.raises(StepError):
            store.record_step_in_transaction(
                "run-1", "attempt-1", _work(write_effect, "two", "two", big), T0
            )
        assert (count_effects("one"), count_effects("two")) == (1, 0)
        record = store.get("run-1")
        assert record is not None and list(steps.steps_of(record)) == ["one"]
