"""Giving back a Firestore claim that landed unseen must not count its attempt: the handler
never ran, so ``max_attempts=1`` must still let the retry run it (review finding: the release
counted it, and the task was failed without ever running)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from google.api_core import exceptions as api

from tasklease.errors import StoreUnavailable
from tasklease.worker.core.records import RunStatus, Verdict
from tasklease.worker.stores import FirestoreStore
from tests.support.firestore_faults import LANDED_THEN_FAILED, Scripted
from tests.support.helpers import T0, claim_request
from tests.support.stores import ReceiptWorker


def test_a_released_orphan_claim_leaves_the_attempt_count_as_it_was(
    firestore_store: FirestoreStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = firestore_store
    document = Scripted(store, monkeypatch)
    document.fail("create", LANDED_THEN_FAILED, after_running=True)
    document.fail("get", api.ServiceUnavailable("down"))
    with pytest.raises(StoreUnavailable):
        store.claim(claim_request(), T0)
    claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + timedelta(seconds=1))
    assert claim.verdict is Verdict.CLAIMED
    assert claim.record.attempts == 1  # The orphan never ran: this is the first execution.


def test_a_task_with_max_attempts_one_runs_after_its_first_claim_landed_unseen(
    firestore_store: FirestoreStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = firestore_store
    document = Scripted(store, monkeypatch)
    document.fail("create", LANDED_THEN_FAILED, after_running=True)
    document.fail("get", api.ServiceUnavailable("down"))
    worker = ReceiptWorker(store, max_attempts=1)
    replies = [worker.deliver(retry) for retry in range(2)]
    assert [(r.status_code, r.headers["X-Tasklease-Outcome"]) for r in replies] == [
        (503, "unavailable"),
        (200, "processed"),
    ]
    assert len(worker.runs) == 1
    record = store.get(replies[1].headers["X-Tasklease-Run-Id"])
    assert record is not None
    assert (record.status, record.attempts) == (RunStatus.COMPLETED, 1)
