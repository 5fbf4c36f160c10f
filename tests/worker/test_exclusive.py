"""Exclusive scheduled jobs and per-key mutual exclusion, through Flask's test client."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import flask
import pytest

from tasklease.errors import ConfigurationError, StoreUnavailable
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core import locking
from tasklease.worker.core.constants import MAX_CLOCK_SKEW
from tasklease.worker.core.records import LockRequest, RunStatus
from tasklease.worker.delivery.lease import LeaseKeeper
from tasklease.worker.stores import MemoryStore
from tests.support.helpers import FakeClock, job_headers, task_headers, wait_for
from tests.worker.test_lease_keeper import context_for

LEASE = timedelta(minutes=1)
MAX_RUNTIME = timedelta(minutes=10)
# A time when the slots below are due (not manual runs: those lie ahead of the clock).
NOW = datetime(2026, 10, 16, 13, 0, tzinfo=UTC)
SLOT_1, SLOT_2 = "2026-10-16T12:00:00Z", "2026-10-16T12:30:00Z"
JOB_LOCK = locking.job_lock_name("nightly", None, None)


class Jobs:
    """Handlers that count their executions; the next one blocks on a gate :func:`hold` set."""

    def __init__(self) -> None:
        self.router = Router()
        self.calls: Counter[str] = Counter()
        self.contexts: list[TaskContext] = []
        self.started = threading.Semaphore(0)
        self.gates: list[threading.Event] = []
        lock = threading.Lock()

        def body(name: str, ctx: TaskContext) -> str:
            with lock:
                self.calls[name] += 1
                self.contexts.append(ctx)
                gate = self.gates.pop(0) if self.gates else None
            self.started.release()
            assert gate is None or gate.wait(20), "the test never opened the gate"
            return f"{name} done"

        options: dict[str, Any] = {"lease": LEASE, "exclusive": True, "max_runtime": MAX_RUNTIME}
        self.router.scheduled("nightly", **options)(lambda ctx: body("nightly", ctx))
        self.router.scheduled("hourly", on_overlap="retry", **options)(
            lambda ctx: body("hourly", ctx)
        )
        self.router.scheduled("gapped", min_gap=timedelta(minutes=5), **options)(
            lambda ctx: body("gapped", ctx)
        )
        self.router.task("post_ledger", lease=LEASE, concurrency_key=lambda p: p["account_id"])(
            lambda payload, ctx: body(f"post_ledger:{payload['account_id']}", ctx)
        )


@pytest.fixture
def jobs() -> Jobs:
    return Jobs()


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def app(jobs: Jobs, store: MemoryStore, clock: FakeClock) -> flask.Flask:
    return create_app(jobs.router, store=store, auth="none", clock=clock)


@pytest.fixture
def background() -> Any:
    with ThreadPoolExecutor(4) as pool:
        yield pool


def post_job(app: flask.Flask, job: str = "nightly", slot: str = SLOT_1) -> Any:
    return app.test_client().post(f"/jobs/{job}", headers=job_headers(job, slot))


def post_task(app: flask.Flask, task: str, account: str, retry: int = 0) -> Any:
    return app.test_client().post(
        "/tasks/post_ledger",
        headers=task_headers(task=task, retry=retry, execution=retry),
        json={"account_id": account},
    )


def hold(jobs: Jobs, pool: ThreadPoolExecutor, deliver: Any) -> tuple[Future[Any], threading.Event]:
    """Start ``deliver``, whose handler then waits for the gate returned; return once it runs."""
    gate = threading.Event()
    jobs.gates.append(gate)
    future = pool.submit(deliver)
    assert jobs.started.acquire(timeout=10), "the handler never started"
    return future, gate


def test_a_second_run_of_an_exclusive_job_is_skipped_recorded_and_answered_200_again(
    app: flask.Flask, jobs: Jobs, store: MemoryStore, background: ThreadPoolExecutor
) -> None:
    first, gate = hold(jobs, background, lambda: post_job(app, slot=SLOT_1))
    holder = jobs.contexts[0].run_id
    second = post_job(app, slot=SLOT_2)
    assert second.status_code == 200
    assert second.headers["X-Tasklease-Outcome"] == "skipped_overlap"
    assert second.json["held_by"] == holder
    skipped = store.list_runs(RunStatus.SKIPPED)
    assert [r.run_id for r in skipped] == [second.headers["X-Tasklease-Run-Id"]]
    assert skipped[0].result == {"held_by": holder, "lock": JOB_LOCK}
    gate.set()
    assert first.result(timeout=10).headers["X-Tasklease-Outcome"] == "processed"
    again = post_job(app, slot=SLOT_2)  # Scheduler's duplicate of the skipped run.
    assert (again.status_code, again.headers["X-Tasklease-Outcome"]) == (200, "skipped_overlap")
    assert again.json["held_by"] == holder
    assert jobs.calls == Counter({"nightly": 1})
    lock = store.get_lock(JOB_LOCK)
    assert lock is not None
    assert lock.released


def test_on_overlap_retry_answers_409_and_the_retry_runs_once_the_holder_finished(
    app: flask.Flask, jobs: Jobs, store: MemoryStore, background: ThreadPoolExecutor
) -> None:
    first, gate = hold(jobs, background, lambda: post_job(app, "hourly", SLOT_1))
    busy = post_job(app, "hourly", SLOT_2)
    assert busy.status_code == 409
    assert busy.headers["X-Tasklease-Outcome"] == "in_progress"
    assert 1 <= int(busy.headers["Retry-After"]) <= 10
    record = store.get(busy.headers["X-Tasklease-Run-Id"])
    assert record is not None
    assert (record.status, record.attempts) == (RunStatus.RELEASED, 0)  # Not consumed.
    gate.set()
    assert first.result(timeout=10).status_code == 200
    retried = post_job(app, "hourly", SLOT_2)
    assert retried.headers["X-Tasklease-Outcome"] == "processed"
    assert jobs.contexts[-1].attempt == 1
    assert jobs.calls == Counter({"hourly": 2})


def test_a_manual_run_takes_the_same_lock(
    app: flask.Flask, jobs: Jobs, clock: FakeClock, background: ThreadPoolExecutor
) -> None:
    first, gate = hold(jobs, background, lambda: post_job(app, slot=SLOT_1))
    next_slot = (clock() + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    manual = post_job(app, slot=next_slot)  # `gcloud scheduler jobs run`: the next slot's time.
    assert manual.headers["X-Tasklease-Outcome"] == "skipped_overlap"
    gate.set()
    first.result(timeout=10)
    assert jobs.calls == Counter({"nightly": 1})


def test_min_gap_makes_a_run_starting_soon_after_the_last_start_an_overlap(
    app: flask.Flask, jobs: Jobs, clock: FakeClock
) -> None:
    assert post_job(app, "gapped", SLOT_1).headers["X-Tasklease-Outcome"] == "processed"
    clock.advance(timedelta(minutes=4))
    soon = post_job(app, "gapped", SLOT_2)
    assert soon.headers["X-Tasklease-Outcome"] == "skipped_overlap"
    clock.advance(timedelta(minutes=1))
    later = post_job(app, "gapped", "2026-10-16T12:45:00Z")
    assert later.headers["X-Tasklease-Outcome"] == "processed"


def test_a_crashed_holder_keeps_the_job_until_max_runtime_then_the_next_run_proceeds(
    app: flask.Flask, jobs: Jobs, store: MemoryStore, clock: FakeClock
) -> None:
    # A run claimed and took the lock, then its process died: nothing renews either.
    store.acquire_lock(LockRequest(JOB_LOCK, "crashed-run", "a1", LEASE, MAX_RUNTIME), clock())
    clock.advance(LEASE + MAX_CLOCK_SKEW)  # Its lease has lapsed, max_runtime has not.
    hourly = locking.job_lock_name("hourly", None, None)
    store.acquire_lock(LockRequest(hourly, "crashed-run", "a1", LEASE, MAX_RUNTIME), NOW)
    assert post_job(app, "hourly", SLOT_2).status_code == 409
    assert post_job(app).headers["X-Tasklease-Outcome"] == "skipped_overlap"
    clock.advance(MAX_RUNTIME)
    proceeded = post_job(app, "hourly", SLOT_2)
    assert proceeded.headers["X-Tasklease-Outcome"] == "processed"
    assert not store.release_lock(hourly, "a1", clock())  # The crashed holder's late release.
    assert jobs.calls == Counter({"hourly": 1})


def test_a_run_alive_past_max_runtime_keeps_the_job_and_a_stale_holders_finish_is_refused(
    app: flask.Flask,
    jobs: Jobs,
    store: MemoryStore,
    clock: FakeClock,
    background: ThreadPoolExecutor,
) -> None:
    first, gate = hold(jobs, background, lambda: post_job(app, "hourly", SLOT_1))
    ctx = jobs.contexts[0]
    hourly = locking.job_lock_name("hourly", None, None)
    assert ctx.lock == hourly
    # It keeps renewing (as its lease keeper would) well past max_runtime.
    for _ in range(3 * int(MAX_RUNTIME / LEASE)):
        clock.advance(LEASE / 3)
        assert store.renew(ctx.run_id, ctx.attempt_id, LEASE, clock())
        assert store.renew_lock(hourly, ctx.attempt_id, LEASE, clock())
    assert post_job(app, "hourly", SLOT_2).status_code == 409
    # Then its renewals stop (cut off from the store): once its lease lapses, the next run
    # starts, and runs to its end.
    clock.advance(LEASE + MAX_CLOCK_SKEW)
    taken = post_job(app, "hourly", SLOT_2)
    assert taken.headers["X-Tasklease-Outcome"] == "processed"
    gate.set()  # The first run, still going unheard, ends only now.
    stale = first.result(timeout=10)
    assert (stale.status_code, stale.headers["X-Tasklease-Outcome"]) == (409, "lost_claim")
    record = store.get(ctx.run_id)
    assert record is not None
    assert record.status is RunStatus.RELEASED  # Its outcome was refused, not recorded.
    lock = store.get_lock(hourly)
    assert lock is not None
    assert lock.holder_run_id == taken.headers["X-Tasklease-Run-Id"]


def test_a_task_whose_key_is_busy_gets_409_key_busy_and_keeps_its_run(
    app: flask.Flask, jobs: Jobs, store: MemoryStore, background: ThreadPoolExecutor
) -> None:
    first, gate = hold(jobs, background, lambda: post_task(app, "t1", "acct-1"))
    busy = post_task(app, "t2", "acct-1")
    assert busy.status_code == 409
    assert busy.headers["X-Tasklease-Outcome"] == "key_busy"
    assert busy.json["held_by"] == jobs.contexts[0].run_id
    assert 1 <= int(busy.headers["Retry-After"]) <= 10
    record = store.get(busy.headers["X-Tasklease-Run-Id"])
    assert record is not None
    assert (record.status, record.attempts) == (RunStatus.RELEASED, 0)
    # Another key runs meanwhile.
    assert post_task(app, "t3", "acct-2").headers["X-Tasklease-Outcome"] == "processed"
    gate.set()
    assert first.result(timeout=10).headers["X-Tasklease-Outcome"] == "processed"
    retried = post_task(app, "t2", "acct-1", retry=1)
    assert retried.headers["X-Tasklease-Outcome"] == "processed"
    assert jobs.contexts[-1].attempt == 1
    assert jobs.calls == Counter({"post_ledger:acct-1": 2, "post_ledger:acct-2": 1})


def test_a_payload_without_its_concurrency_key_is_a_dead_letter(
    app: flask.Flask, store: MemoryStore
) -> None:
    response = app.test_client().post(
        "/tasks/post_ledger", headers=task_headers(), json={"amount": 5}
    )
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (200, "failed")
    assert "concurrency_key raised KeyError" in response.get_json()["message"]


def test_a_lock_taken_from_a_running_execution_marks_its_lease_lost() -> None:
    store = MemoryStore()
    lease = timedelta(seconds=1.5)
    ctx = context_for(store, lease=lease)
    now = datetime.now(UTC)
    request = LockRequest("job/x", ctx.run_id, ctx.attempt_id, lease)
    assert store.acquire_lock(request, now).acquired
    ctx.lock = "job/x"
    keeper = LeaseKeeper(store, lambda: datetime.now(UTC))
    with keeper.kept(ctx, lease):
        time.sleep(0.6)
        assert not ctx.lease_lost  # Renewed, run and lock.
        store.release_lock("job/x", ctx.attempt_id, now)
        store.acquire_lock(LockRequest("job/x", "other-run", "b1", lease), now)
        assert wait_for(lambda: ctx.lease_lost, 5)
    run = store.get(ctx.run_id)
    assert run is not None
    assert run.status is RunStatus.IN_PROGRESS  # The run itself was not taken over.


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_runtime": timedelta(hours=1)}, "only with exclusive=True"),
        ({"on_overlap": "retry"}, "only with exclusive=True"),
        ({"exclusive": True, "on_overlap": "wait"}, "'skip' or 'retry'"),
        ({"exclusive": True, "max_runtime": timedelta(0)}, "must be positive"),
        ({"exclusive": True, "min_gap": timedelta(seconds=-1)}, "must not be negative"),
    ],
)
def test_exclusion_options_that_would_do_nothing_are_refused(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Router().scheduled("job", **options)(lambda ctx: None)


class LandsUnseen(MemoryStore):
    """Takes the lock, then reports the store unavailable, as a lost answer would."""

    def acquire_lock(self, request: LockRequest, now: Any) -> Any:
        super().acquire_lock(request, now)
        raise StoreUnavailable("the answer was lost")


def test_a_lock_taken_unseen_is_released_with_the_claim_given_back_uncounted(
    jobs: Jobs, clock: FakeClock
) -> None:
    store = LandsUnseen()
    app = create_app(jobs.router, store=store, auth="none", clock=clock)
    response = post_job(app)
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (503, "unavailable")
    lock = store.get_lock(JOB_LOCK)
    assert lock is not None
    assert lock.released  # Not left to block the job for max_runtime.
    record = store.get(response.headers["X-Tasklease-Run-Id"])
    assert record is not None
    assert (record.status, record.attempts) == (RunStatus.RELEASED, 0)
    assert jobs.calls == Counter()
