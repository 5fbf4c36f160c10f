"""Replaying a dead letter whose replay failed too runs its payload again.

Every replay of a run used to have the key ``replay/<run id>``: the second replay mapped to the
first replay's failed run, the queue took it for a duplicate, and the payload never ran while
the command line and the dashboard said "enqueued". A repeated request for one replay (a
double click, a command retried after a lost answer) must still enqueue nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tasklease.errors import StoreUnavailable
from tasklease.producer import MemoryTransport, Producer
from tasklease.worker import PermanentFailure, Router, TaskContext, create_app
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.operate.operations import OperationRefused, Operations, ReplayOutcome
from tasklease.worker.stores import SqliteStore


class FlakyLinks(SqliteStore):
    """A store whose next ``mark_replayed`` fails, as if the request died half way."""

    fail_next_link = False

    def mark_replayed(self, run_id: str, replayed_as: str) -> RunRecord | None:
        if self.fail_next_link:
            self.fail_next_link = False
            raise StoreUnavailable("the store went away before the link was written")
        return super().mark_replayed(run_id, replayed_as)


class Shop:
    """A worker whose ``charge`` handler fails permanently ``failures`` times."""

    def __init__(self, path: Path, failures: int) -> None:
        self.failures = failures
        self.charged: list[int] = []
        router = Router()

        @router.task("charge")
        def charge(payload: Any, ctx: TaskContext) -> None:
            if self.failures > 0:
                self.failures -= 1
                raise PermanentFailure("card declined")
            self.charged.append(payload["order"])

        self.store = FlakyLinks(path)
        self.client = create_app(router, store=self.store, auth="none").test_client()
        self.queue = MemoryTransport()
        producer = Producer("p", "l", "q", "https://w.example", transport=self.queue)
        self.operations = Operations(self.store, producer)
        producer.enqueue("charge", {"order": 7}, key="order-7")
        assert self.deliver() == [200]
        [self.dead] = self.store.query_runs().runs
        assert self.dead.status is RunStatus.FAILED

    def deliver(self) -> list[int]:
        return [self.queue.deliver(t, self.client.post, "q") for t in self.queue.pending()]

    def status(self, run_id: str) -> RunStatus:
        record = self.store.get(run_id)
        assert record is not None
        return record.status


def test_a_dead_letter_whose_replay_failed_too_is_replayed_again_and_runs(tmp_path: Path) -> None:
    shop = Shop(tmp_path / "runs.db", failures=2)
    first = shop.operations.replay(shop.dead.run_id)
    assert (first.outcome, first.created) == (ReplayOutcome.ENQUEUED, True)
    assert shop.deliver() == [200]
    assert shop.status(first.replay_run_id) is RunStatus.FAILED and shop.charged == []

    second = shop.operations.replay(shop.dead.run_id)
    assert (second.outcome, second.created) == (ReplayOutcome.ENQUEUED, True)
    assert second.replayed_run_id == first.replay_run_id
    assert second.replay_run_id not in (shop.dead.run_id, first.replay_run_id)
    assert "of its latest replay" in second.summary and "enqueued as task" in second.summary
    assert shop.deliver() == [200]
    assert shop.charged == [7]
    assert shop.status(second.replay_run_id) is RunStatus.COMPLETED
    replayed = shop.store.get(second.replay_run_id)
    assert replayed is not None and replayed.replay_of == first.replay_run_id

    with pytest.raises(OperationRefused, match="which is completed: nothing to replay"):
        shop.operations.replay(shop.dead.run_id)
    assert len(shop.queue.tasks) == 3 and shop.charged == [7]
    shop.store.close()


def test_a_repeated_request_for_the_same_replay_enqueues_nothing(tmp_path: Path) -> None:
    shop = Shop(tmp_path / "runs.db", failures=1)
    shop.store.fail_next_link = True
    with pytest.raises(StoreUnavailable):  # The task was created, the link was not written.
        shop.operations.replay(shop.dead.run_id)
    retried = shop.operations.replay(shop.dead.run_id)
    assert (retried.outcome, retried.created) == (ReplayOutcome.ALREADY_ENQUEUED, False)
    assert "already enqueued by an earlier request" in retried.summary
    clicked_again = shop.operations.replay(shop.dead.run_id)
    assert (clicked_again.outcome, clicked_again.replay_run_id, clicked_again.task_name) == (
        ReplayOutcome.PENDING,
        retried.replay_run_id,
        retried.task_name,
    )
    assert clicked_again.summary == (
        f"Already replayed: pending as run {retried.replay_run_id} (released); nothing enqueued."
    )
    assert len(shop.queue.tasks) == 2  # The original and one replay.
    assert shop.deliver() == [200]
    assert shop.charged == [7]
    assert shop.status(retried.replay_run_id) is RunStatus.COMPLETED
    shop.store.close()
