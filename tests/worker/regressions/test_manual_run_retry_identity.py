"""A manual Scheduler run keeps its run id across retries, whenever they arrive (review
finding: retries arriving within ``manual_run_margin`` of the slot took the slot's run)."""

from __future__ import annotations

from datetime import timedelta

from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.memory.store import MemoryStore
from tests.support.helpers import FakeClock, job_headers


def test_a_retried_manual_run_keeps_its_run_id_and_the_slot_still_runs(clock: FakeClock) -> None:
    router = Router()
    runs: list[str] = []
    fail_first = [True]

    @router.scheduled("nightly")
    def nightly(ctx: TaskContext) -> None:
        runs.append(ctx.run_id)
        if fail_first:
            fail_first.pop()
            raise RuntimeError("transient")

    app = create_app(router, store=MemoryStore(), auth="none", clock=clock)
    client = app.test_client()
    # clock is 12:00:00; `gcloud scheduler jobs run` sends the next slot, 12:01:10 (70 s ahead).
    slot = "2026-10-16T12:01:10Z"
    first = client.post("/jobs/nightly", headers=job_headers(schedule_time=slot))
    assert first.status_code == 500  # Released for a retry; Scheduler retries the manual run.
    clock.advance(timedelta(seconds=15))  # Scheduler's retry backoff; 55 s before the slot.
    retry = client.post("/jobs/nightly", headers=job_headers(schedule_time=slot))
    assert retry.status_code == 200
    # Cloud Scheduler keeps ScheduleTime constant across retries of one run: same run.
    assert retry.headers["X-Tasklease-Run-Id"] == first.headers["X-Tasklease-Run-Id"]
    clock.advance(timedelta(seconds=55))  # The slot's own delivery arrives.
    scheduled = client.post("/jobs/nightly", headers=job_headers(schedule_time=slot))
    assert scheduled.headers["X-Tasklease-Outcome"] == "processed"
    assert len(runs) == 3


def test_a_manual_run_of_an_every_minute_job_with_a_margin_below_its_interval_is_its_own_run(
    clock: FakeClock,
) -> None:
    # The documented configuration for jobs firing more often than the default 60 s margin.
    router = Router()
    runs: list[str] = []

    @router.scheduled("every_minute", manual_run_margin=timedelta(seconds=10))
    def every_minute(ctx: TaskContext) -> None:
        runs.append(ctx.run_id)

    app = create_app(router, store=MemoryStore(), auth="none", clock=clock)
    client = app.test_client()
    # `gcloud scheduler jobs run` at 12:00:30 for a `* * * * *` job sends the next slot, 12:01.
    clock.advance(timedelta(seconds=30))
    slot = "2026-10-16T12:01:00Z"
    manual = client.post("/jobs/every_minute", headers=job_headers("every_minute", slot))
    assert manual.headers["X-Tasklease-Outcome"] == "processed"
    clock.advance(timedelta(seconds=30))  # 12:01: the slot's own delivery.
    scheduled = client.post("/jobs/every_minute", headers=job_headers("every_minute", slot))
    assert scheduled.headers["X-Tasklease-Outcome"] == "processed"
    assert len(runs) == 2
