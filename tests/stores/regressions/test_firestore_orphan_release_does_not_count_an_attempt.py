"""Giving back a Firestore claim that landed unseen must not count its attempt: the handler
never ran, so ``max_attempts=1`` must still let the retry run it (review finding: the release
counted it, and the task was failed without ever running)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from google.api_core import exceptions as api

from tasklease.errors import StoreUnavailable
from tasklease.worker import Router, create_app
from tasklease.worker.core.records import RunStatus, Verdict
from tasklease.worker.stores import FirestoreStore
from tests.stores.test_store_firestore import LANDED_THEN_FAILED, Scripted
from tests.support.firestore import PROJECT, unique_collection
from tests.support.helpers import T0, claim_request, task_headers


@pytest.fixture
def store(firestore_host: str | None) -> Iterator[FirestoreStore]:
    store = FirestoreStore.from_options(collection=unique_collection(), project=PROJECT)
    yield store
    store.close()


def test_a_released_orphan_claim_leaves_the_attempt_count_as_it_was(
    store: FirestoreStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = Scripted(store, monkeypatch)
    document.fail("create", LANDED_THEN_FAILED, after_running=True)
    document.fail("get", api.ServiceUnavailable("down"))
    with pytest.raises(StoreUnavailable):
        store.claim(claim_request(), T0)
    claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + timedelta(seconds=1))
    assert claim.verdict is Verdict.CLAIMED
    assert claim.record.attempts == 1  # The orphan never ran: this is the first execution.


def test_a_task_with_max_attempts_one_runs_after_its_first_claim_landed_unseen(
    store: FirestoreStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = Router()
    runs: list[str] = []
    router.task("send_receipt", max_attempts=1)(lambda payload, ctx: runs.append(ctx.run_id))
    document = Scripted(store, monkeypatch)
    document.fail("create", LANDED_THEN_FAILED, after_running=True)
    document.fail("get", api.ServiceUnavailable("down"))
    client = create_app(router, store=store, auth="none").test_client()
    replies = [
        client.post("/tasks/send_receipt", headers=task_headers(retry=retry), data=b"{}")
        for retry in range(2)
    ]
    assert [(r.status_code, r.headers["X-Tasklease-Outcome"]) for r in replies] == [
        (503, "unavailable"),
        (200, "processed"),
    ]
    assert len(runs) == 1
    record = store.get(replies[1].headers["X-Tasklease-Run-Id"])
    assert record is not None
    assert (record.status, record.attempts) == (RunStatus.COMPLETED, 1)
