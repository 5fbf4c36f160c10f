"""A hostile review of durable waits: each test here shows a promise of docs/how-to/waits.md
(or of the scheduled-run and lock guides) that the code breaks."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar

from tasklease.errors import StoreUnavailable
from tasklease.protocol import RESUME_HEADER
from tasklease.testing.contract_support import claim_request
from tasklease.testing.stubs import StubQueue, StubScheduler
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core import locking
from tasklease.worker.core.records import LockRequest, RunRecord, RunStatus
from tasklease.worker.core.waits import SignalError, Wait, waits_of
from tasklease.worker.operate.signals import send_signal, signal
from tasklease.worker.stores import MemoryStore
from tasklease.worker.stores.base.locks import lock_store
from tasklease.worker.stores.base.store import Change

_T = TypeVar("_T")

# The headers a producer puts on every task it creates (a resume task too): sent on the
# Scheduler's delivery as well, so that both deliveries name the same job lock.
PROJECT_HEADERS = {"X-Tasklease-Project": "test-project", "X-Tasklease-Location": "us-central1"}


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def other_run_holds(store: MemoryStore, lock: str) -> None:
    """Another run of the job (the next slot's) holds the job's lock now."""
    request = LockRequest(lock, "f" * 64, "next-slot", timedelta(minutes=10))
    assert lock_store(store).acquire_lock(request, datetime.now(UTC)).acquired


def test_an_exclusive_jobs_resumed_run_waits_for_the_job_rather_than_being_skipped() -> None:
    """A waiting run holds no lock, so the job's next slot may run meanwhile; the resume that
    then finds the job busy skips the run for good: the signal was accepted (True), the steps
    before the wait ran, and nothing after the wait ever runs. A continuation in the same
    place waits for the job (409) instead."""
    store, router = MemoryStore(), Router()
    locks: list[str] = []
    after: list[Any] = []

    @router.scheduled("nightly", schedule="0 3 * * *", exclusive=True)
    def nightly(ctx: TaskContext) -> None:
        locks.append(locking.job_lock_name("nightly", ctx.project, ctx.location))
        ctx.step("ask", lambda: None)
        after.append(ctx.wait_for("go"))

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    slot = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)
    StubScheduler().bind(router).fire(client, "nightly", slot, headers=PROJECT_HEADERS)
    (run,) = store.list_runs()
    other_run_holds(store, locks[0])
    assert signal(run.run_id, "go", "approved", store=store, producer=queue.producer) is True
    summary = queue.drain(client)
    assert [d.outcome for d in summary.deliveries] != ["skipped_overlap"]
    record = store.get(run.run_id)
    assert record is not None and record.status is not RunStatus.SKIPPED
    assert lock_store(store).release_lock(locks[0], "next-slot", datetime.now(UTC))
    queue.redeliver()  # The resume's retry, once the job is free.
    queue.drain(client)
    assert after == ["approved"]
    queue.close()


def test_a_resumed_scheduled_run_holds_the_same_job_lock_as_its_first_delivery() -> None:
    """Cloud Scheduler sends no project header, the producer puts one on every task: the
    resume of a scheduled run takes the lock ``job/<project>/<location>/nightly`` where its
    first delivery took ``job///nightly``, so it runs beside the next slot's run that holds
    the job's lock: ``exclusive=True`` does not hold across a wait."""
    store, router = MemoryStore(), Router()
    locks: list[str] = []

    @router.scheduled("nightly", schedule="0 3 * * *", exclusive=True, on_overlap="retry")
    def nightly(ctx: TaskContext) -> None:
        locks.append(locking.job_lock_name("nightly", ctx.project, ctx.location))
        ctx.wait_for("go")

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    StubScheduler().bind(router).fire(client, "nightly", datetime(2026, 12, 4, 3, tzinfo=UTC))
    (run,) = store.list_runs()
    other_run_holds(store, locks[0])  # The next slot's run, on the Scheduler's lock name.
    assert signal(run.run_id, "go", None, store=store, producer=queue.producer)
    queue.max_attempts = 1
    queue.drain(client)
    assert len(set(locks)) == 1, locks
    record = store.get(run.run_id)
    assert record is not None and record.status is not RunStatus.COMPLETED
    queue.close()


def test_a_manual_run_that_waited_does_not_take_its_slots_own_delivery() -> None:
    """A manual run's retry carries the slot's headers, so a slot's delivery that finds the
    manual run released is taken for it, trusting the manual run's own retry to run the slot.
    After a wait, the manual run's retry is a resume task, which finds the manual run done and
    is answered as a duplicate: the slot's own run never happens."""
    clock = Clock(datetime(2026, 12, 4, 12, 30, tzinfo=UTC))
    store, router = MemoryStore(), Router()
    blips: list[int] = []

    @router.scheduled("hourly", schedule="0 * * * *")
    def hourly(ctx: TaskContext) -> None:
        ctx.wait_for("go")
        if not blips:
            blips.append(1)
            raise RuntimeError("a blip after the resume: retried")

    queue = StubQueue(max_attempts=1).bind(router)  # The resume's retry comes later.
    client = create_app(router, store=store, auth="none", clock=clock).test_client()
    scheduler = StubScheduler().bind(router)
    scheduler.add_job("hourly", "0 * * * *")
    scheduler.fire(client, "hourly", clock.now, manual=True)  # Carries 13:00, the next slot.
    (manual,) = store.list_runs()
    assert signal(manual.run_id, "go", None, store=store, producer=queue.producer)
    queue.drain(client)  # The resumed delivery fails once: released.
    clock.now = datetime(2026, 12, 4, 13, 0, 5, tzinfo=UTC)
    scheduler.fire(client, "hourly", datetime(2026, 12, 4, 13, tzinfo=UTC))  # The slot's own.
    queue.max_attempts = 5
    queue.redeliver()
    queue.drain(client)  # The manual run's retry: its resume task.
    triggers = sorted(r.identity.get("trigger", "") for r in store.list_runs())
    assert triggers == ["manual", "scheduled"]
    queue.close()


def test_a_handler_that_catches_the_suspension_runs_no_step_before_the_signal() -> None:
    """``WaitSuspended`` is a BaseException so that ``except Exception`` lets it through, and
    the executor still suspends a handler that caught it. But a step after the caught wait
    runs (and is recorded) before any signal: the effect the wait guards happens unapproved.
    A second ``wait_for`` and ``continue_later`` are refused after a suspension; a step is
    not."""
    store, router = MemoryStore(), Router()
    charged: list[int] = []

    @router.task("order")
    def order(payload: Any, ctx: TaskContext) -> Any:
        try:
            decision = ctx.wait_for("approval")
        except BaseException:  # A broad cleanup handler that does not re-raise.
            decision = None
        ctx.step("charge", lambda: charged.append(1))
        return decision

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("order", None, key="o")
    queue.drain(client)
    (record,) = store.list_runs()
    assert record.status is RunStatus.WAITING
    assert charged == []  # No approval yet: nothing may be charged.
    queue.close()


class CappedStore(MemoryStore):
    """A store whose record holds at most ``max_record_bytes``, as Firestore's document does:
    a bigger write fails, as Firestore's ``INVALID_ARGUMENT`` reaches a caller (through
    the store's guard, as StoreUnavailable)."""

    max_record_bytes: ClassVar[int | None] = 1_048_576

    def _read_modify_write(self, run_id: str, change: Change[_T]) -> _T:
        def capped(record: RunRecord | None) -> tuple[RunRecord | None, _T]:
            written, value = change(record)
            if written is not None:
                size = sum(
                    len(text.encode())
                    for text in (
                        written.payload,
                        written.steps_json,
                        written.continuation_json,
                        written.waits_json,
                        written.result_json,
                        written.error,
                    )
                    if text
                )
                if size > (self.max_record_bytes or size):
                    raise StoreUnavailable(f"Firestore store: document of {size} bytes is too big")
            return written, value

        return super()._read_modify_write(run_id, capped)


def test_a_signal_a_waiting_runs_record_cannot_hold_is_refused_naming_the_fix() -> None:
    """The suspension checks that the payload fits beside the steps recorded so far, not
    beside the signal to come (up to MAX_SIGNAL_PAYLOAD_BYTES), and the signal's own check
    counts the steps and signals, not the payload the record keeps: the signal's write
    cannot land, and every sender is told the store is unavailable (503, "send it again")
    while the run waits for a signal that can never be recorded."""
    store, router = CappedStore(), Router()

    @router.task("big")
    def big(payload: Any, ctx: TaskContext) -> Any:
        return len(ctx.wait_for("go"))

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("big", "x" * 850_000, key="b")
    queue.drain(client)
    (run,) = store.list_runs()
    assert run.status is RunStatus.WAITING  # The suspension found that the payload fits.
    try:
        send_signal(run.run_id, "go", "y" * 240_000, store=store, producer=queue.producer)
    except SignalError:
        pass  # Refused, naming the fix (a smaller payload): what the docs promise.
    except StoreUnavailable as exc:
        raise AssertionError(f"an unsendable signal is reported as an outage: {exc}") from exc
    queue.close()


def waiting_run(store: MemoryStore, run_id: str) -> None:
    now = datetime.now(UTC)
    identity = {"queue": "default", "task_name": "t"}
    store.claim(claim_request(run_id, handler="approve", identity=identity), now)
    store.suspend(run_id, "attempt-1", Wait("approval", 0, now, None, queue="default"), None, now)


def approving_app(store: MemoryStore, *, producer: bool = True) -> tuple[Any, Callable[[], None]]:
    router = Router()

    @router.task("approve")
    def approve(payload: Any, ctx: TaskContext) -> Any:
        return ctx.wait_for("approval")

    queue = StubQueue().bind(router) if producer else None
    client = create_app(router, store=store, auth="none").test_client()
    return client, (queue.close if queue is not None else lambda: None)


def test_the_signal_route_answers_a_deeply_nested_body_400() -> None:
    """The guide promises 400 for a bad body; JSON nested past the recursion limit (well
    within the 256 KB allowed) raises RecursionError out of json.loads, answered 500."""
    store, run_id = MemoryStore(), "a" * 64
    waiting_run(store, run_id)
    client, close = approving_app(store)
    answer = client.post(f"/signals/{run_id}/approval", data=b"[" * 100_000)
    assert answer.status_code == 400
    close()


def test_the_signal_route_does_not_say_a_signal_it_never_recorded_is_recorded() -> None:
    """With no producer configured, ``executor.router.producer()`` raises before
    ``send_signal`` runs, inside the try whose handler answers "the signal is recorded ...
    send it again" (503): nothing was recorded, and sending again never helps."""
    store, run_id = MemoryStore(), "a" * 64
    waiting_run(store, run_id)
    client, close = approving_app(store, producer=False)
    answer = client.post(f"/signals/{run_id}/approval", data=b"true")
    record = store.get(run_id)
    assert record is not None and record.waits_json is not None
    recorded = '"signals"' in record.waits_json
    assert recorded or "is recorded" not in answer.json["message"], answer.json["message"]
    close()


class SuspendFails(MemoryStore):
    """A store whose suspension writes fail while ``down``: the worker dies, in effect,
    after creating the timeout task and before recording the wait."""

    down = True

    def suspend(
        self,
        run_id: str,
        attempt_id: str,
        wait: Wait | None,
        payload: str | None,
        now: Any,
        *,
        keep_for: timedelta | None = None,
    ) -> RunRecord | None:
        if self.down:
            raise StoreUnavailable("the store is down")
        return super().suspend(run_id, attempt_id, wait, payload, now, keep_for=keep_for)


def test_the_timeout_task_is_due_when_the_recorded_wait_times_out() -> None:
    """The guide: "the worker dies after creating the timeout task, before recording the
    wait: the queue retries it, and the steps replay up to the wait again". The retry
    computes a new deadline (its own now + timeout) and records it, but the timeout task of
    that name exists already, due at the first attempt's deadline, and Cloud Tasks creates it
    once: it comes early, is answered 409 until the queue's retries run out (a queue with
    max_attempts set), and the wait never times out."""
    clock = Clock(datetime(2026, 12, 4, 12, 0, tzinfo=UTC))
    store, router = SuspendFails(), Router()

    @router.task("approve")
    def approve(payload: Any, ctx: TaskContext) -> Any:
        return ctx.wait_for("approval", timeout=timedelta(hours=1))

    queue = StubQueue(max_attempts=1).bind(router)
    client = create_app(router, store=store, auth="none", clock=clock).test_client()
    queue.producer.enqueue("approve", None, key="a")
    queue.drain(client)  # The timeout task is created; the wait is not recorded.
    store.down = False
    clock.now += timedelta(minutes=10)  # The queue's retry, once the lease has run out.
    queue.redeliver()
    queue.drain(client)
    (record,) = store.list_runs()
    assert record.status is RunStatus.WAITING
    recorded = waits_of(record).wait
    assert recorded is not None and recorded.deadline is not None
    timeouts = [t for t in queue.tasks if t.request.headers.get(RESUME_HEADER)]
    assert recorded.deadline in [task.schedule_time for task in timeouts]
    queue.close()


def test_a_wait_name_the_resume_header_cannot_carry_is_refused_at_the_wait() -> None:
    """A wait name is checked as a step name (200 characters, no NUL), but the resume task
    carries it percent-encoded in a header the worker reads up to 1024 characters: a name
    of 190 non-ASCII characters suspends the run, its signal is accepted, and every
    delivery of its resume task is refused (400) until the queue gives up. The run never
    resumes."""
    store, router = MemoryStore(), Router()
    name = "é" * 190  # "wait:" and the name: within the 200 of a step name.

    @router.task("approve")
    def approve(payload: Any, ctx: TaskContext) -> Any:
        return ctx.wait_for(name)

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("approve", None, key="a")
    queue.drain(client)
    (run,) = store.list_runs()
    if run.status is RunStatus.WAITING:  # Else refused at the wait: what should happen.
        assert signal(run.run_id, name, "yes", store=store, producer=queue.producer)
        queue.drain(client)
        record = store.get(run.run_id)
        assert record is not None and record.status is RunStatus.COMPLETED
    queue.close()
