"""A Firestore transaction that ``@firestore.transactional`` re-runs after an aborted commit
(contention with a relay's claim, for one) must stage its outbox entry again: the re-run's
commit is the one that counts, and an order committed without its entry is a lost task."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import firestore

from tests.support.outbox import producer


@pytest.fixture
def client(firestore_host: str | None) -> Iterator[firestore.Client]:
    client = firestore.Client(project=f"outbox-{uuid.uuid4().hex[:10]}")
    yield client
    client.close()  # type: ignore[no-untyped-call]


def test_a_retried_transaction_commits_the_order_with_its_entry(
    client: firestore.Client,
) -> None:
    tx = client.transaction()
    commit = tx._commit
    aborted: list[bool] = []

    def abort_once() -> Any:
        if not aborted:
            aborted.append(True)
            raise exceptions.Aborted("too much contention")
        return commit()

    tx._commit = abort_once  # type: ignore[method-assign]
    runs: list[bool] = []

    @firestore.transactional
    def checkout(tx: Any) -> None:
        tx.set(client.collection("orders").document("42"), {"total": 990})
        runs.append(
            producer("http://127.0.0.1:9")
            .enqueue("send_receipt", {"order": 42}, key="o42", transaction=tx)
            .staged
        )

    checkout(tx)
    assert aborted and runs == [True, True]  # Re-run, and staged again the second time.
    assert [doc.id for doc in client.collection("orders").stream()] == ["42"]
    assert len(list(client.collection("tasklease_outbox").stream())) == 1
