"""A manual Scheduler run and its slot's own run both complete, whenever the manual run's
retries arrive: after the slot, less than the clock-skew bound before it, or after its first
delivery found the store down (review finding: each of these merged the manual run into the
slot's run, and one of the two never completed).

Cloud Scheduler sends a manual run's retries with the same headers as the slot's own delivery
(job name and the slot's ScheduleTime, docs/platform-facts.md): only the store's record of the
manual run, or this worker's memory of it, tells them apart.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import flask

from tasklease.worker.core.identity import Kind, parse_identity
from tasklease.worker.core.records import RunStatus
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.memory.store import MemoryStore
from tests.support.helpers import T0, FakeClock, SwitchableStore, claim_request, job_headers

# `gcloud scheduler jobs run` at 12:00:00 sends the next slot, 12:01:10 (70 s ahead).
SLOT = T0 + timedelta(seconds=70)
SLOT_TEXT = "2026-10-16T12:01:10Z"


class Job:
    """A scheduled handler whose first execution fails (so Scheduler retries that run)."""

    def __init__(self, clock: FakeClock, store: MemoryStore | SwitchableStore) -> None:
        self.clock = clock
        self.store = store
        self.completed: list[str] = []
        self.failures = 1
        router = Router()

        @router.scheduled("nightly")
        def nightly(ctx: TaskContext) -> None:
            if self.failures:
                self.failures -= 1
                raise RuntimeError("transient")
            self.completed.append(ctx.run_id)

        self.app: flask.Flask = create_app(router, store=store, auth="none", clock=clock)

    def deliver_at(self, moment: datetime) -> tuple[int, str, str]:
        self.clock.now = moment
        reply = self.app.test_client().post(
            "/jobs/nightly", headers=job_headers("nightly", SLOT_TEXT)
        )
        return (
            reply.status_code,
            reply.headers["X-Tasklease-Outcome"],
            reply.headers.get("X-Tasklease-Run-Id", ""),
        )

    def assert_both_runs_completed(self) -> None:
        assert len(self.completed) == 2, self.completed
        assert len(set(self.completed)) == 2, "one run was executed twice, the other never"
        triggers = []
        for run_id in self.completed:
            record = self.store.get(run_id)
            assert record is not None
            assert record.status is RunStatus.COMPLETED
            triggers.append(record.identity["trigger"])
        assert sorted(triggers) == ["manual", "scheduled"]


def test_a_manual_runs_retry_arriving_after_the_slot_completes_the_manual_run(
    clock: FakeClock,
) -> None:
    job = Job(clock, MemoryStore())
    manual = job.deliver_at(T0)
    assert manual[:2] == (500, "released")
    retry = job.deliver_at(SLOT + timedelta(seconds=5))  # Scheduler's backoff ran past the slot.
    assert retry[1:] == ("processed", manual[2])  # The manual run's own id.
    scheduled = job.deliver_at(SLOT + timedelta(seconds=6))  # The slot's own delivery, late.
    assert scheduled[1] == "processed"
    job.assert_both_runs_completed()


def test_a_slot_delivered_while_its_manual_run_waits_for_a_retry_still_leaves_both_runs_done(
    clock: FakeClock,
) -> None:
    job = Job(clock, MemoryStore())
    assert job.deliver_at(T0)[:2] == (500, "released")
    first = job.deliver_at(SLOT)  # The slot's own delivery, the manual run's retry still due.
    second = job.deliver_at(SLOT + timedelta(seconds=20))  # The other of the two.
    assert (first[1], second[1]) == ("processed", "processed")
    job.assert_both_runs_completed()


def test_a_manual_runs_retry_arriving_less_than_the_clock_skew_before_the_slot_is_its_own(
    clock: FakeClock,
) -> None:
    job = Job(clock, MemoryStore())
    manual = job.deliver_at(T0)
    retry = job.deliver_at(SLOT - timedelta(milliseconds=500))
    assert retry[1:] == ("processed", manual[2])
    assert job.deliver_at(SLOT)[1] == "processed"
    job.assert_both_runs_completed()


def test_a_manual_run_whose_first_delivery_found_the_store_down_is_still_its_own_run(
    clock: FakeClock,
) -> None:
    store = SwitchableStore(MemoryStore())
    job = Job(clock, store)
    job.failures = 0
    store.down = True
    manual = job.deliver_at(T0)
    assert manual[:2] == (503, "unavailable")
    store.down = False
    # Scheduler's retries: one within the margin, before the slot, then the slot itself.
    retry = job.deliver_at(SLOT - timedelta(seconds=50))
    assert retry[1:] == ("processed", manual[2])
    assert job.deliver_at(SLOT)[1] == "processed"
    job.assert_both_runs_completed()


def test_a_manual_run_whose_first_delivery_found_the_store_down_and_retried_after_the_slot(
    clock: FakeClock,
) -> None:
    store = SwitchableStore(MemoryStore())
    job = Job(clock, store)
    job.failures = 0
    store.down = True
    manual = job.deliver_at(T0)
    store.down = False
    scheduled = job.deliver_at(SLOT)
    retry = job.deliver_at(SLOT + timedelta(seconds=30))
    assert (scheduled[1], retry[1]) == ("processed", "processed")
    assert manual[2] in (scheduled[2], retry[2])
    job.assert_both_runs_completed()


def test_a_slot_delivered_while_its_manual_run_still_runs_is_not_turned_away(
    clock: FakeClock,
) -> None:
    """A live manual run does not make the slot's own delivery wait: Scheduler's retry_count
    defaults to 0, so a 409 would lose the slot's run."""
    store = MemoryStore()
    job = Job(clock, store)
    job.failures = 0
    clock.now = T0
    # The manual run, still running on another instance.
    request = claim_request(run_id=_manual_run_id(), kind="scheduler", handler="nightly")
    manual = store.claim(request, T0)
    assert manual.record.status is RunStatus.IN_PROGRESS
    scheduled = job.deliver_at(SLOT)
    assert scheduled[:2] == (200, "processed")
    assert scheduled[2] != manual.record.run_id


def test_a_manual_run_unrecorded_anywhere_and_retried_elsewhere_after_its_slot_runs_once(
    clock: FakeClock,
) -> None:
    """The limit of what can be told: the manual run's first delivery found the store down
    on one instance, its retry reaches another after the slot. Nothing distinguishes it from
    the slot's own delivery; the job runs once for both, never twice."""
    shared = SwitchableStore(MemoryStore())
    here, there = Job(clock, shared), Job(clock, shared)
    here.failures = there.failures = 0
    shared.down = True
    assert here.deliver_at(T0)[:2] == (503, "unavailable")
    shared.down = False
    retry = there.deliver_at(SLOT + timedelta(seconds=5))
    scheduled = there.deliver_at(SLOT + timedelta(seconds=6))
    assert (retry[1], scheduled[1]) == ("processed", "duplicate")
    assert len(here.completed + there.completed) == 1


def _manual_run_id() -> str:
    headers = job_headers("nightly", SLOT_TEXT)
    identity = parse_identity(
        Kind.SCHEDULER, "nightly", lambda name: [headers[name]] if name in headers else [], {}
    )
    return identity.as_manual().run_id
