"""The lease keeper renews running executions and notices a takeover."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from datetime import UTC, datetime, timedelta
from typing import Any

import flask
import pytest

from tasklease.errors import LeaseLost
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.constants import MAX_CLOCK_SKEW
from tasklease.worker.delivery.lease import LeaseKeeper
from tasklease.worker.handlers.attempt import Attempt
from tasklease.worker.stores import MemoryStore
from tests.support.helpers import SwitchableStore, claim_request, task_headers, wait_for

LEASE = timedelta(seconds=1.5)


def now() -> datetime:
    return datetime.now(UTC)


def context_for(
    store: Any, attempt: str = "attempt-1", run_id: str = "run-1", lease: timedelta = LEASE
) -> Attempt:
    """A claimed attempt, as the executor hands it to the lease keeper."""
    asked = time.monotonic()
    request = claim_request(run_id, attempt_id=attempt, lease=lease)
    record = store.claim(request, now()).record
    ctx = Attempt("task", "h", record.run_id, attempt, record.lease_expires)
    ctx.confirm_lease(record.lease_expires, asked + lease.total_seconds())
    return ctx


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
    store.claim(
        claim_request(attempt_id="attempt-2", lease=LEASE), ctx.lease_expires + MAX_CLOCK_SKEW
    )
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
    original = store.renew_run

    def slow_renew(*args: Any, **kwargs: Any) -> Any:
        started.set()
        time.sleep(0.3)  # Meanwhile the execution finishes and completes the run.
        return original(*args, **kwargs)

    store.renew_run = slow_renew  # type: ignore[method-assign]
    with keeper.kept(ctx, LEASE):
        assert started.wait(5)
    store.complete("run-1", "attempt-1", None, now())
    time.sleep(0.5)
    assert not ctx.lease_lost
    assert not [r for r in caplog.records if "lost its claim" in r.getMessage()]


def test_renewals_that_keep_failing_lose_the_lease_when_it_runs_out_locally() -> None:
    # An instance cut off from its store must stop before another may take its run over.
    store = SwitchableStore(MemoryStore())
    ctx = context_for(store)
    store.down = True
    started = time.monotonic()
    with LeaseKeeper(store, now).kept(ctx, LEASE):
        assert wait_for(lambda: ctx.lease_lost, seconds=5)
        lost_after = time.monotonic() - started
    assert lost_after <= LEASE.total_seconds() + 0.2
    with pytest.raises(LeaseLost):
        ctx.check_lease()
    store.down = False
    assert not ctx.lease_lost or ctx.lease_seconds_left == 0  # Lost for good.


def test_a_self_fenced_handler_stops_before_a_takeover_can_start() -> None:
    router = Router()
    store = SwitchableStore(MemoryStore())
    checks: list[tuple[str, float]] = []
    starts: list[tuple[str, float]] = []

    @router.task("careful", lease=timedelta(seconds=1))
    def careful(payload: Any, ctx: TaskContext) -> None:
        starts.append((ctx.attempt_id, time.monotonic()))
        store.down_after_claim = False
        while True:
            ctx.check_lease()
            checks.append((ctx.attempt_id, time.monotonic()))
            if ctx.attempt > 1:
                return
            time.sleep(0.02)

    app: flask.Flask = create_app(router, store=store, auth="none")
    store.down_after_claim = True  # Cut off from the store once the first claim is granted.
    first = app.test_client().post("/tasks/careful", headers=task_headers())
    assert first.headers["X-Tasklease-Outcome"] == "lost_claim"
    store.down = False
    time.sleep(1 + MAX_CLOCK_SKEW.total_seconds())  # Past lease and skew: a retry takes over.
    retry = app.test_client().post("/tasks/careful", headers=task_headers(retry=1))
    assert retry.headers["X-Tasklease-Outcome"] == "processed"
    first_attempt = starts[0][0]
    last_check_of_first = max(t for attempt, t in checks if attempt == first_attempt)
    assert last_check_of_first < starts[1][1]
    assert last_check_of_first - starts[0][1] <= 1.2


def test_max_attempts_does_not_dead_letter_a_run_whose_first_attempt_holds_its_lease() -> None:
    router = Router()
    nested: list[Any] = []

    @router.task("once", lease=timedelta(seconds=1), max_attempts=1)
    def once(payload: Any, ctx: TaskContext) -> str:
        time.sleep(1.5)  # Outlives the first lease: only renewals keep the run.
        nested.append(app.test_client().post("/tasks/once", headers=task_headers(retry=1)))
        return "done"

    app: flask.Flask = create_app(router, store=MemoryStore(), auth="none")
    first = app.test_client().post("/tasks/once", headers=task_headers())
    assert nested[0].headers["X-Tasklease-Outcome"] == "in_progress"
    assert first.headers["X-Tasklease-Outcome"] == "processed"


class _StuckRenewals(SwitchableStore):
    """Renewals of run ``stuck`` block until unblocked; others pass straight through."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.unblocked = threading.Event()

    def renew_run(
        self, run_id: str, attempt_id: str, lease: timedelta, now: Any, **kwargs: Any
    ) -> Any:
        if run_id == "stuck":
            self.unblocked.wait(10)
        return self.inner.renew_run(run_id, attempt_id, lease, now, **kwargs)


def test_a_renewal_stuck_on_one_run_does_not_delay_another_runs_renewal() -> None:
    store = _StuckRenewals()
    stuck = context_for(store, run_id="stuck")
    free = context_for(store, run_id="free")
    first_expiry = free.lease_expires
    keeper = LeaseKeeper(store, now)
    try:
        with keeper.kept(stuck, LEASE), keeper.kept(free, LEASE):
            time.sleep(LEASE.total_seconds() * 0.8)  # Both were due at a third of the lease.
            renewed = store.get("free")
            assert renewed is not None
            assert renewed.lease_expires > first_expiry, "run free was not renewed in time"
            assert not free.lease_lost
    finally:
        store.unblocked.set()


def test_a_finished_execution_leaves_the_keeper_at_once() -> None:
    store = MemoryStore()
    keeper = LeaseKeeper(store, now)
    live = context_for(store)
    ctx = TaskContext(
        "task",
        "h",
        live.run_id,
        live.attempt_id,
        1,
        1,
        live.lease_expires,
        b"x" * 100_000,
        live=live,
    )
    gone = weakref.ref(ctx), weakref.ref(live)
    with keeper.kept(live, LEASE):
        assert keeper.kept_count == 1
    assert keeper.kept_count == 0
    del ctx, live
    gc.collect()
    assert gone[0]() is None, "the finished execution and its body are still held"
    assert gone[1]() is None, "the keeper still holds the finished attempt"
