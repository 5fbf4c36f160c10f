"""The lease keeper renews running executions and notices a takeover."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import flask

from tests.helpers import SwitchableStore, claim_request, task_headers
from worker import Router, TaskContext, create_app
from worker.lease import LeaseKeeper
from worker.stores import MemoryStore

LEASE = timedelta(seconds=1.5)


def now() -> datetime:
    return datetime.now(UTC)


def context_for(store: Any, attempt: str = "attempt-1") -> TaskContext:
    record = store.claim(claim_request(attempt_id=attempt, lease=LEASE), now()).record
    return TaskContext(
        kind="task",
        handler="h",
        run_id=record.run_id,
        attempt_id=attempt,
        fencing_token=1,
        attempt=1,
        lease_expires=record.lease_expires,
    )


def wait_for(condition: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_lease_is_renewed_while_the_block_runs_and_not_after() -> None:
    store = MemoryStore()
    ctx = context_for(store)
    first_expiry = ctx.lease_expires
    keeper = LeaseKeeper(store, now)
    with keeper.kept(ctx, LEASE):
        assert wait_for(lambda: store.get("run-1").lease_expires > first_expiry)  # type: ignore[union-attr]
    assert ctx.lease_expires == store.get("run-1").lease_expires  # type: ignore[union-attr]
    assert not ctx.lease_lost


def test_renewal_that_finds_a_takeover_marks_the_context_lost() -> None:
    store = MemoryStore()
    ctx = context_for(store)
    # Another attempt took over (as after an expiry): our attempt id no longer matches.
    store.claim(claim_request(attempt_id="attempt-2", lease=LEASE), ctx.lease_expires)
    with LeaseKeeper(store, now).kept(ctx, LEASE):
        assert wait_for(lambda: ctx.lease_lost)


def test_renewal_survives_a_store_outage() -> None:
    store = SwitchableStore(MemoryStore())
    ctx = context_for(store)
    first_expiry = ctx.lease_expires
    store.down = True
    with LeaseKeeper(store, now).kept(ctx, LEASE):
        time.sleep(0.7)  # At least one renewal attempt fails meanwhile.
        store.down = False
        assert wait_for(lambda: ctx.lease_expires > first_expiry)
    assert not ctx.lease_lost


def test_long_handler_keeps_its_run_against_a_concurrent_retry() -> None:
    router = Router()
    calls = []
    started = threading.Event()

    @router.task("slow", lease=timedelta(seconds=2))
    def slow(payload: Any, ctx: TaskContext) -> None:
        calls.append(ctx.attempt_id)
        started.set()
        time.sleep(5)  # Outlives the 2 s lease more than twice over.

    app: flask.Flask = create_app(router, store=MemoryStore(), auth="none")
    results: list[Any] = []
    worker = threading.Thread(
        target=lambda: results.append(app.test_client().post("/tasks/slow", headers=task_headers()))
    )
    worker.start()
    started.wait(5)
    time.sleep(3)  # Past the original lease: without renewal a retry would take over.
    retry = app.test_client().post("/tasks/slow", headers=task_headers(retry=1))
    worker.join()
    assert retry.headers["X-Tasklease-Outcome"] == "in_progress"
    assert results[0].headers["X-Tasklease-Outcome"] == "processed"
    assert len(calls) == 1


def test_a_renewal_racing_the_finish_is_not_reported_as_a_lost_lease(
    caplog: Any,
) -> None:
    store = MemoryStore()
    ctx = context_for(store)
    keeper = LeaseKeeper(store, now)
    started = threading.Event()
    original = store.renew

    def slow_renew(*args: Any) -> bool:
        started.set()
        time.sleep(0.3)  # Meanwhile the execution finishes and completes the run.
        return original(*args)

    store.renew = slow_renew  # type: ignore[method-assign]
    with keeper.kept(ctx, LEASE):
        assert started.wait(5)
    store.complete("run-1", "attempt-1", None, now())
    time.sleep(0.5)
    assert not ctx.lease_lost
    assert not [r for r in caplog.records if "lost its claim" in r.getMessage()]
