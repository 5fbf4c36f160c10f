"""On Firestore ``ctx.transaction`` is the client's ``Transaction``, a ``WriteBatch`` whose
public ``commit()`` (and ``with tx:`` block, which calls it) commits the writes buffered so
far *outside* the transaction. A handler that calls it kept those writes without the run's
record: when the attempt then failed (here it raises), the retry wrote them again. Ending
the transaction is the framework's: both are refused, nothing the handler wrote is kept."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.cloud import firestore

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores import FirestoreStore
from tests.support.firestore import PROJECT, unique_collection
from tests.support.helpers import task_headers

pytestmark = pytest.mark.service


@pytest.fixture
def store(firestore_host: str | None) -> Iterator[FirestoreStore]:
    store = FirestoreStore.from_options(collection=unique_collection(), project=PROJECT)
    yield store
    store.close()


def _enter(tx: Any) -> None:
    with tx:
        pass


@pytest.mark.parametrize("end", [lambda tx: tx.commit(), _enter], ids=["commit", "with"])
def test_a_firestore_handler_that_commits_its_transaction_keeps_its_writes_once_at_most(
    store: FirestoreStore, end: Callable[[Any], None]
) -> None:
    effects = store.client.collection(f"effects_{uuid.uuid4().hex[:8]}").document("charged")
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.set(effects, {"n": firestore.Increment(1)}, merge=True)
        if ctx.attempt == 1:
            end(ctx.transaction)
            raise RuntimeError("the receipt could not be sent")

    client = create_app(router, store=store, auth="none").test_client()
    first = client.post("/tasks/charge", headers=task_headers(), data=b"{}")
    retry = client.post("/tasks/charge", headers=task_headers(retry=1, execution=1), data=b"{}")
    snapshot = effects.get()
    kept = int(snapshot.get("n")) if snapshot.exists else 0
    outcomes = [first.headers["X-Tasklease-Outcome"], retry.headers["X-Tasklease-Outcome"]]
    assert (outcomes, kept) == (["released", "processed"], 1)
