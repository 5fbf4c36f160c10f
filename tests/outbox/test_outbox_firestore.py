"""The outbox in Firestore: entries staged through a ``Transaction``, relayed once after commit
(against Google's Firestore emulator, tests/support/firestore.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from google.cloud import firestore

from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import NotInTransaction
from tasklease.outbox.firestore_db import FirestoreOutbox
from tasklease.producer import EnqueueResult, task_id
from tests.support.outbox import Outboxes, drain_at_once, producer, task_names


@pytest.fixture
def project(firestore_host: str | None) -> str:
    """A project of its own in the emulator: its own tasklease_outbox collection."""
    return f"outbox-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def url(project: str) -> str:
    return f"firestore://?project={project}"


@pytest.fixture
def client(project: str) -> Iterator[firestore.Client]:
    client = firestore.Client(project=project)
    yield client
    client.close()  # type: ignore[no-untyped-call]


def place_order(
    client: firestore.Client, endpoint: str, order: int, *, fail: bool = False, queue: str = ""
) -> EnqueueResult:
    """A request handler: the order document and its receipt task in one transaction."""
    results: list[EnqueueResult] = []

    @firestore.transactional
    def checkout(tx: Any) -> None:
        tx.set(client.collection("orders").document(str(order)), {"total": 990})
        results.append(
            producer(endpoint).enqueue(
                "send_receipt",
                {"order": order},
                key=f"o{order}",
                transaction=tx,
                queue=queue or None,
            )
        )
        if fail:
            raise RuntimeError("payment declined")  # After the enqueue: all of it rolls back.

    checkout(client.transaction())
    return results[-1]


def test_a_committed_transaction_stages_the_entry_and_the_relay_creates_its_task_once(
    client: firestore.Client, url: str, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    result = place_order(client, tasks.url, 42)
    assert result.staged and not result.created
    assert task_names(tasks) == []  # Nothing sent before the relay, even after the commit.
    db, relay = outboxes.relay_for(url, tasks, FirestoreOutbox)
    assert relay.drain().sent == 1
    assert task_names(tasks) == [task_id("send_receipt", "o42")]
    assert relay.drain().claimed == 0  # Marked sent: never sent again.
    status = db.status(0)
    assert (status.depth, status.sent, status.failed_total) == (0, 1, 0)


def test_rolled_back_transactions_leave_no_entry_and_create_no_task(
    client: firestore.Client, url: str, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    for order in range(20):
        with pytest.raises(RuntimeError, match="payment declined"):
            place_order(client, tasks.url, order, fail=True)
    assert list(client.collection("tasklease_outbox").stream()) == []
    assert list(client.collection("orders").stream()) == []
    _db, relay = outboxes.relay_for(url, tasks, FirestoreOutbox)
    assert relay.drain().claimed == 0
    assert task_names(tasks) == []


def test_a_transaction_not_in_progress_or_a_batch_is_refused(client: firestore.Client) -> None:
    make = producer("http://127.0.0.1:9")
    with pytest.raises(NotInTransaction, match="not in progress"):
        make.enqueue("x", {}, key="k", transaction=client.transaction())
    with pytest.raises(TypeError, match="firestore Transaction"):
        make.enqueue("x", {}, key="k", transaction=client.batch())
    assert list(client.collection("tasklease_outbox").stream()) == []


def test_a_key_staged_again_keeps_one_entry_within_and_across_transactions(
    client: firestore.Client, url: str, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    make = producer(tasks.url)

    @firestore.transactional
    def twice(tx: Any) -> list[bool]:
        return [make.enqueue("x", {}, key="same", transaction=tx).staged for _ in range(2)]

    assert twice(client.transaction()) == [True, False]
    assert twice(client.transaction()) == [False, False]  # Committed before: the name is taken.
    assert len(list(client.collection("tasklease_outbox").stream())) == 1
    _db, relay = outboxes.relay_for(url, tasks, FirestoreOutbox)
    assert relay.drain().sent == 1
    assert task_names(tasks) == [task_id("x", "same")]


def test_racing_relays_claim_disjoint_batches_and_create_each_task_once(
    client: firestore.Client, url: str, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    @firestore.transactional
    def stage(tx: Any) -> None:
        producer(tasks.url).enqueue_many(
            "record", [(f"k{n}", {}) for n in range(120)], transaction=tx
        )

    stage(client.transaction())
    relays = [outboxes.relay_for(url, tasks, FirestoreOutbox) for _ in range(3)]
    claimed = drain_at_once([relay for _, relay in relays], batch=20)
    assert sum(claimed) == 120  # No entry claimed twice, none left.
    assert len(task_names(tasks)) == 120
    assert relays[0][0].status(0).sent == 120


def test_a_poison_entry_fails_with_its_reason_and_can_be_requeued(
    client: firestore.Client, url: str, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    place_order(client, tasks.url, 1)
    place_order(client, tasks.url, 2, queue="no-such-queue")
    db, relay = outboxes.relay_for(url, tasks, FirestoreOutbox)
    done = relay.drain()
    assert (done.sent, done.failed) == (1, 1)
    status = db.status(0)
    assert status.failed_total == 1 and "no-such-queue" in status.failed[0].reason
    assert db.requeue_failed() == 1
    assert db.status(0).depth == 1
    assert db.purge_sent(before=10**10) == 1  # The sent entry; the requeued one stays.
    assert db.status(0).sent == 0


def test_a_commit_wakes_the_relays_listener_at_once(
    client: firestore.Client, url: str, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    db, relay = outboxes.relay_for(url, tasks, FirestoreOutbox)
    db.wait(2)  # Starts the listener; its first snapshot (empty here) may or may not fire.
    assert db.wait(0.2) is False  # Nothing committed: no wake-up.
    place_order(client, tasks.url, 7)
    assert db.wait(30) is True  # Woken by the commit, not by a poll.
    assert relay.drain().sent == 1
