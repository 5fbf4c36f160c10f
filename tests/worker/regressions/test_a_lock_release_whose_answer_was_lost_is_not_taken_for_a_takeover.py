"""Finding (by the seeded simulation, seed 1 of 2,000 lifecycles on memory and SQLite): a keyed
task releases its concurrency key's lock before recording its completion. When that release
committed but its answer was lost, the retried release found the lock already taken by the
next run of the key, and the finish took that for a takeover: 409 ``lost_claim``, the
completion never recorded, and the queue's retry ran the handler a second time."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

from tasklease.errors import StoreUnavailable
from tasklease.worker.core.records import LockRecord, LockRequest, RunRecord
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.base.store import Moment, resolve
from tasklease.worker.stores.memory.store import MemoryStore
from tests.support.helpers import task_headers


class ReleaseAnswerLost(MemoryStore):
    """The first lock release commits, the next run of the key takes the lock, and only then
    does the release's caller hear anything: an error, as if its answer was lost."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_next_release = True

    def release_lock(self, name: str, attempt_id: str, now: Moment) -> bool:
        released = super().release_lock(name, attempt_id, now)
        if self.lose_next_release:
            self.lose_next_release = False
            request = LockRequest(name, "the-next-run", "its-attempt", timedelta(seconds=30))
            assert self.acquire_lock(request, now).acquired
            raise StoreUnavailable("the connection dropped before the release's answer came")
        return released


def test_a_release_that_landed_unheard_lets_the_run_complete_once() -> None:
    router = Router()
    calls: list[str] = []

    @router.task("post_ledger", concurrency_key=lambda payload: payload["account"])
    def post_ledger(payload: Any, ctx: TaskContext) -> None:
        calls.append(ctx.attempt_id)

    client = create_app(router, store=ReleaseAnswerLost(), auth="none").test_client()
    body = json.dumps({"account": "acct-1"})
    first = client.post("/tasks/post_ledger", headers=task_headers(), data=body)
    assert first.status_code == 200, first.get_json()
    assert first.headers["X-Tasklease-Outcome"] == "processed"
    retry = client.post("/tasks/post_ledger", headers=task_headers(retry=1), data=body)
    assert retry.headers["X-Tasklease-Outcome"] == "duplicate", retry.get_json()
    assert len(calls) == 1


class ReleaseAnswerLostAndReadFails(ReleaseAnswerLost):
    """As :class:`ReleaseAnswerLost`, and the first read of the lock then fails too (found by
    the soak: SQLite, seed 75, an exclusive job's slot answered lost_claim and ran again)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next_read = True

    def get_lock(self, name: str) -> LockRecord | None:
        if self.fail_next_read:
            self.fail_next_read = False
            raise StoreUnavailable("the store did not answer the read")
        return super().get_lock(name)


def test_a_release_that_landed_unheard_is_recognised_though_a_read_fails_once() -> None:
    router = Router()
    calls: list[str] = []

    @router.task("post_ledger", concurrency_key=lambda payload: payload["account"])
    def post_ledger(payload: Any, ctx: TaskContext) -> None:
        calls.append(ctx.attempt_id)

    store = ReleaseAnswerLostAndReadFails()
    client = create_app(router, store=store, auth="none").test_client()
    body = json.dumps({"account": "acct-1"})
    first = client.post("/tasks/post_ledger", headers=task_headers(), data=body)
    assert first.status_code == 200, first.get_json()
    assert first.headers["X-Tasklease-Outcome"] == "processed"
    assert not store.fail_next_read
    assert len(calls) == 1


class ReleaseAnswerLostAndStoreDown(ReleaseAnswerLost):
    """As :class:`ReleaseAnswerLost`, and the store then answers nothing more (found by the
    soak: SQLite, seed 83, an outage began as the release was retried)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def release_lock(self, name: str, attempt_id: str, now: Moment) -> bool:
        if self.down:
            return super().release_lock(name, attempt_id, now)
        try:
            return super().release_lock(name, attempt_id, now)
        finally:
            self.down = True

    def get_lock(self, name: str) -> LockRecord | None:
        if self.down:
            raise StoreUnavailable("the store is down")
        return super().get_lock(name)


def test_a_release_that_cannot_be_told_from_a_takeover_is_unrecorded_not_lost() -> None:
    router = Router()

    @router.task("post_ledger", concurrency_key=lambda payload: payload["account"])
    def post_ledger(payload: Any, ctx: TaskContext) -> None:
        pass

    client = create_app(router, store=ReleaseAnswerLostAndStoreDown(), auth="none").test_client()
    body = json.dumps({"account": "acct-1"})
    first = client.post("/tasks/post_ledger", headers=task_headers(), data=body)
    assert first.status_code == 503, first.get_json()
    assert first.headers["X-Tasklease-Outcome"] == "unrecorded"


class ReleaseFailsAfterATakeover(MemoryStore):
    """No renewal gets through, so the holder's lease lapses while its handler runs; its first
    lock release fails without committing, and another run has taken the lock meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next_release = True

    def renew_run(
        self,
        run_id: str,
        attempt_id: str,
        lease: timedelta,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> RunRecord | None:
        raise StoreUnavailable("the store does not answer renewals")

    def release_lock(self, name: str, attempt_id: str, now: Moment) -> bool:
        if self.fail_next_release:
            self.fail_next_release = False
            request = LockRequest(name, "the-next-run", "its-attempt", timedelta(seconds=30))
            later = resolve(now) + timedelta(minutes=5)  # Past the lapsed lease and its margin.
            assert self.acquire_lock(request, later).acquired
            raise StoreUnavailable("the connection dropped before the release was sent")
        return super().release_lock(name, attempt_id, now)


def test_a_retried_release_after_the_lease_lapsed_is_still_a_takeover() -> None:
    router = Router()

    @router.task(
        "post_ledger",
        lease=timedelta(seconds=1),
        concurrency_key=lambda payload: payload["account"],
    )
    def post_ledger(payload: Any, ctx: TaskContext) -> None:
        time.sleep(1.2)  # Past the lease by the local clock: only ever longer under load.

    client = create_app(router, store=ReleaseFailsAfterATakeover(), auth="none").test_client()
    body = json.dumps({"account": "acct-1"})
    first = client.post("/tasks/post_ledger", headers=task_headers(), data=body)
    assert first.status_code == 409, first.get_json()
    assert first.headers["X-Tasklease-Outcome"] == "lost_claim"
