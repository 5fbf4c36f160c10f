"""The transaction contract: the tests a :class:`~tasklease.worker.stores.TransactionalStore`
passes, so that a ``transactional=True`` handler's writes are kept exactly when its run
completes.

A store's test class inherits it and provides three fixtures: ``store`` (a fresh, empty
store), ``write_effect`` (a function ``(tx, key)`` writing one row, document or mutation for
``key`` through the store's native transaction ``tx``) and ``count_effects`` (a function
``(key) -> int`` counting the committed ones, outside any transaction)::

    class TestMyStoreTransactions(TransactionContract):
        @pytest.fixture
        def write_effect(self):
            return lambda tx, key: tx.execute("INSERT INTO effects VALUES (?)", (key,))
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from tasklease.testing.contract_support import EXPIRED, T0, claim_request
from tasklease.worker.core import decisions
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.base.transactional import TransactionalStore

WriteEffect = Callable[[Any, str], None]
CountEffects = Callable[[str], int]


class Boom(Exception):
    """What the contract's failing work raises."""


class TransactionContract:
    """Semantics every :class:`TransactionalStore` must have."""

    def test_the_work_and_the_completion_record_commit_together(
        self,
        store: TransactionalStore,
        write_effect: WriteEffect,
        count_effects: CountEffects,
    ) -> None:
        store.claim(claim_request(), T0)

        def work(tx: Any) -> str:
            write_effect(tx, "paid")
            return '{"ok":true}'

        outcome = store.complete_in_transaction("run-1", "attempt-1", work, T0)
        assert (outcome.held, outcome.result_json) == (True, '{"ok":true}')
        assert outcome.tries >= 1
        assert count_effects("paid") == 1
        record = store.get("run-1")
        assert record is not None
        assert (record.status, record.attempt_id, record.result_json) == (
            RunStatus.COMPLETED,
            "attempt-1",
            '{"ok":true}',
        )

    def test_work_that_raises_keeps_nothing_and_the_attempt_still_holds_the_claim(
        self,
        store: TransactionalStore,
        write_effect: WriteEffect,
        count_effects: CountEffects,
    ) -> None:
        store.claim(claim_request(), T0)

        def work(tx: Any) -> str:
            write_effect(tx, "paid")
            raise Boom("after the write")

        with pytest.raises(Boom):
            store.complete_in_transaction("run-1", "attempt-1", work, T0)
        assert count_effects("paid") == 0
        assert decisions.holds(store.get("run-1"), "attempt-1")
        # The attempt can still finish the run as usual, or retry the transaction.
        outcome = store.complete_in_transaction(
            "run-1", "attempt-1", lambda tx: write_effect(tx, "paid"), T0
        )
        assert outcome.held
        assert count_effects("paid") == 1

    def test_a_claim_taken_over_after_its_lease_lapsed_commits_nothing(
        self,
        store: TransactionalStore,
        write_effect: WriteEffect,
        count_effects: CountEffects,
    ) -> None:
        store.claim(claim_request(), T0)
        store.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)
        outcome = store.complete_in_transaction(
            "run-1", "attempt-1", lambda tx: write_effect(tx, "paid"), T0 + EXPIRED
        )
        assert (outcome.held, outcome.result_json) == (False, None)
        assert count_effects("paid") == 0
        assert decisions.holds(store.get("run-1"), "attempt-2")

    def test_a_stale_attempt_can_never_commit_after_the_run_completed(
        self,
        store: TransactionalStore,
        write_effect: WriteEffect,
        count_effects: CountEffects,
    ) -> None:
        store.claim(claim_request(), T0)
        store.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)
        done = store.complete_in_transaction(
            "run-1", "attempt-2", lambda tx: write_effect(tx, "paid"), T0 + EXPIRED
        )
        assert done.held
        for attempt in ("attempt-1", "attempt-2"):  # The stale one, and the finished one again.
            again = store.complete_in_transaction(
                "run-1", attempt, lambda tx: write_effect(tx, "paid"), T0 + EXPIRED
            )
            assert not again.held
        assert count_effects("paid") == 1
        record = store.get("run-1")
        assert record is not None
        assert (record.status, record.attempt_id) == (RunStatus.COMPLETED, "attempt-2")

    def test_a_released_attempt_cannot_commit(
        self,
        store: TransactionalStore,
        write_effect: WriteEffect,
        count_effects: CountEffects,
    ) -> None:
        store.claim(claim_request(), T0)
        assert store.release("run-1", "attempt-1", "gave up", T0)
        outcome = store.complete_in_transaction(
            "run-1", "attempt-1", lambda tx: write_effect(tx, "paid"), T0
        )
        assert not outcome.held
        assert count_effects("paid") == 0

    def test_a_retried_finish_recognises_its_own_commit(
        self,
        store: TransactionalStore,
        write_effect: WriteEffect,
        count_effects: CountEffects,
    ) -> None:
        store.claim(claim_request(), T0)

        def work(tx: Any) -> str:
            write_effect(tx, "paid")
            return "7"

        store.complete_in_transaction("run-1", "attempt-1", work, T0)
        # An answer lost with the commit: the record tells it landed, by this attempt.
        record = store.get("run-1")
        assert decisions.finished_by(record, "attempt-1", RunStatus.COMPLETED)
        # A plain completion retried by the same attempt is recognised, not refused...
        assert store.complete("run-1", "attempt-1", "7", T0)
        # ...and giving the claim back afterwards cannot undo the commit.
        assert not store.release("run-1", "attempt-1", "late", T0)
        record = store.get("run-1")
        assert record is not None
        assert (record.status, record.result_json) == (RunStatus.COMPLETED, "7")
        assert count_effects("paid") == 1

    def test_the_completion_keeps_the_record_for_the_retention_asked(
        self,
        store: TransactionalStore,
        write_effect: WriteEffect,
    ) -> None:
        store.claim(claim_request(), T0)
        keep = timedelta(days=30)  # Longer than the claim's retention (7 days).
        store.complete_in_transaction(
            "run-1", "attempt-1", lambda tx: write_effect(tx, "paid"), T0, keep_for=keep
        )
        record = store.get("run-1")
        assert record is not None
        assert record.expire_at >= T0 + keep
