"""A Firestore create that conflicts (possibly with its own first try, retried by the client)
and whose read-back fails must be noted as an orphan like any claim that may have landed
unseen: else the retry waits out a whole lease (409, Retry-After about 301 s) although the
handler never ran (review finding)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from google.api_core import exceptions as api

from tasklease.errors import StoreUnavailable
from tasklease.worker.core.records import Verdict
from tasklease.worker.stores import FirestoreStore
from tests.support.firestore_faults import Scripted
from tests.support.helpers import T0, claim_request
from tests.support.stores import ReceiptWorker

# The client retried a create whose first try committed: the retry conflicts with it.
OWN_FIRST_TRY = api.Conflict("already exists")


def test_a_conflicting_create_that_cannot_be_read_back_is_released_for_the_retry(
    firestore_store: FirestoreStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = firestore_store
    document = Scripted(store, monkeypatch)
    document.fail("create", OWN_FIRST_TRY, after_running=True)
    document.fail("get", api.ServiceUnavailable("down"))
    with pytest.raises(StoreUnavailable):
        store.claim(claim_request(), T0)
    claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + timedelta(seconds=1))
    assert (claim.verdict, claim.record.attempt_id) == (Verdict.CLAIMED, "attempt-2")


def test_the_worker_runs_the_retry_at_once_after_a_conflict_it_could_not_read(
    firestore_store: FirestoreStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = firestore_store
    document = Scripted(store, monkeypatch)
    document.fail("create", OWN_FIRST_TRY, after_running=True)
    document.fail("get", api.ServiceUnavailable("down"))
    worker = ReceiptWorker(store)
    replies = [worker.deliver(retry) for retry in range(2)]
    assert [(r.status_code, r.headers["X-Tasklease-Outcome"]) for r in replies] == [
        (503, "unavailable"),
        (200, "processed"),
    ]
    assert len(worker.runs) == 1
