"""``ctx.continue_later`` from scheduled handlers: the Scheduler delivery is answered 200 and
the same scheduled run goes on in Cloud Tasks tasks on the job's route, through the real
executor on a real SQLite file."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import flask
import pytest

from tasklease import protocol
from tasklease.producer import Producer
from tasklease.producer.errors import InvalidTask
from tasklease.producer.memory import MemoryTransport
from tasklease.testing.contract_support import T0
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core import steps
from tasklease.worker.core.identity import DeliveryIdentity, Kind
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import CapturingProducer, FakeClock, job_headers, task_headers

SLOT = "2026-10-16T12:00:00Z"  # T0: the slot's own delivery, not a manual run.


@pytest.fixture
def store(tmp_path: Path) -> SqliteStore:
    return SqliteStore(tmp_path / "runs.db")


def scheduled_run_id(job: str = "nightly", handler: str = "nightly") -> str:
    when = datetime.fromisoformat(SLOT.replace("Z", "+00:00"))
    return DeliveryIdentity(Kind.SCHEDULER, handler, job_name=job, schedule_time=when).run_id


def fire(app: flask.Flask, handler: str = "nightly") -> Any:
    """The Scheduler's delivery of the slot."""
    return app.test_client().post(f"/jobs/{handler}", headers=job_headers(schedule_time=SLOT))


def resume(
    app: flask.Flask, run_id: str, seq: int, *, retry: int = 0, route: str = "/jobs/nightly"
) -> Any:
    """Cloud Tasks' delivery of continuation ``seq`` of ``run_id``."""
    headers = task_headers(queue="reports", task=f"c-{seq}", retry=retry) | {
        protocol.CONTINUATION_HEADER: f"{run_id}:{seq}"
    }
    return app.test_client().post(route, headers=headers, data=b"null")


def outcome(reply: Any) -> str:
    return str(reply.headers[protocol.OUTCOME_HEADER])


def continuing_app(
    store: SqliteStore, seen: list[Any], *, use_async: bool = False, **options: Any
) -> tuple[flask.Flask, CapturingProducer]:
    """A ``nightly`` job that continues three times (one step per delivery), recording what
    each delivery saw in ``seen``."""
    router = Router()

    def body(ctx: TaskContext) -> Any:
        page = (ctx.state or {"page": 0})["page"]
        seen.append((ctx.continuation, page, ctx.run_id, ctx.job_name, ctx.schedule_time))
        return page

    if use_async:

        @router.scheduled("nightly", **options)
        async def nightly_async(ctx: TaskContext) -> Any:
            page = body(ctx)
            await ctx.astep(f"page-{page}", lambda: page)
            if page < 3:
                ctx.continue_later({"page": page + 1}, delay=timedelta(seconds=30))
                return None
            return {"pages": page + 1}

    else:

        @router.scheduled("nightly", **options)
        def nightly(ctx: TaskContext) -> Any:
            page = body(ctx)
            ctx.step(f"page-{page}", lambda: page)
            if page < 3:
                ctx.continue_later({"page": page + 1}, delay=timedelta(seconds=30))
                return None
            return {"pages": page + 1}

    producer = CapturingProducer()
    router.use_producer(producer)  # type: ignore[arg-type]
    return create_app(router, store=store, auth="none", clock=FakeClock()), producer


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_scheduled_run_continues_three_times_in_tasks_and_completes_once(
    store: SqliteStore, use_async: bool
) -> None:
    seen: list[Any] = []
    app, producer = continuing_app(store, seen, use_async=use_async, queue="reports")
    run_id = scheduled_run_id()
    first = fire(app)
    assert (first.status_code, outcome(first)) == (200, "processed")  # Scheduler stops here.
    assert outcome(fire(app)) == "duplicate"  # The Scheduler's own retry (a lost answer).
    for seq in (1, 2, 3):
        assert resume(app, run_id, seq + 1).status_code == 409  # Ahead of the run: waits.
        assert outcome(resume(app, run_id, seq)) == "processed"
        assert outcome(resume(app, run_id, seq, retry=1)) == "duplicate"
    assert outcome(resume(app, run_id, 2, retry=3)) == "duplicate"  # A late duplicate.
    when = datetime.fromisoformat(SLOT.replace("Z", "+00:00"))
    assert seen == [(n, n, run_id, "nightly", when) for n in range(4)]
    assert sorted(producer.tasks) == [steps.continuation_key(run_id, n) for n in (1, 2, 3)]
    task = producer.tasks[steps.continuation_key(run_id, 1)]
    assert task["name"] == "nightly" and task["payload"] is None
    assert task["route"] == protocol.SCHEDULER_ROUTE_PREFIX
    assert task["queue"] == "reports"  # The handler's declared queue.
    assert task["headers"] == {protocol.CONTINUATION_HEADER: f"{run_id}:1"}
    assert task["delay"] == timedelta(seconds=30)
    record = store.get(run_id)
    assert record is not None
    assert (record.status, record.kind, record.result) == (
        RunStatus.COMPLETED,
        "scheduler",
        {"pages": 4},
    )
    assert record.identity["job_name"] == "nightly"  # The run's own identity, not a task's.
    assert record.identity["schedule_time"].startswith("2026-10-16T12:00:00")
    assert "task_name" not in record.identity
    assert list(steps.steps_of(record)) == ["page-3"]
    assert steps.continuation_of(record).seq == 3
    assert steps.continuation_of(record).state == {"page": 3}
    assert outcome(fire(app)) == "duplicate"  # The slot stays done.


def test_a_scheduled_continuation_without_a_declared_queue_goes_to_the_producers(
    store: SqliteStore,
) -> None:
    app, producer = continuing_app(store, [])
    fire(app)
    (task,) = producer.tasks.values()
    assert task["queue"] is None  # The producer's default queue.


def test_the_producer_targets_the_jobs_route_for_a_scheduled_continuation() -> None:
    router = Router()
    router.scheduled("nightly")(lambda ctx: None)
    transport = MemoryTransport()
    producer = Producer(
        "p", "us-central1", "default", "http://worker", transport=transport, router=router
    )
    producer.enqueue("nightly", None, key="k", route=protocol.SCHEDULER_ROUTE_PREFIX)
    (queued,) = transport.tasks
    assert queued.request.url == "http://worker/jobs/nightly"
    with pytest.raises(InvalidTask, match="no task handler"):
        producer.enqueue("nightly", None, key="k")  # On /tasks/ the router's check stands.
    with pytest.raises(InvalidTask, match="route"):
        producer.enqueue("nightly", None, key="k", route="/elsewhere/")


def test_a_forged_continuation_naming_a_run_never_continued_is_rejected(
    store: SqliteStore,
) -> None:
    router = Router()
    router.scheduled("nightly")(lambda ctx: {"done": True})
    app = create_app(router, store=store, auth="none", clock=FakeClock())
    never = resume(app, "a" * 64, 1)
    assert never.status_code == 400
    assert store.get("a" * 64) is None
    # A run that exists but never continued: its continuation is forged.
    router2 = Router()
    ran: list[int] = []

    @router2.scheduled("nightly")
    def slow(ctx: TaskContext) -> None:
        ran.append(ctx.continuation)
        raise RuntimeError("released, never continued")

    app2 = create_app(router2, store=store, auth="none", clock=FakeClock())
    fire(app2)
    forged = resume(app2, scheduled_run_id(), 1)
    assert forged.status_code == 400
    assert "never continued" in forged.get_json()["message"]
    assert ran == [0]


def test_a_continuation_naming_another_handlers_run_is_rejected(store: SqliteStore) -> None:
    seen: list[Any] = []
    app, _ = continuing_app(store, seen)
    run_id = scheduled_run_id()
    fire(app)
    router = Router()
    router.scheduled("other")(lambda ctx: seen.append("other"))
    router.task("nightly")(lambda payload, ctx: seen.append("task"))
    other = create_app(router, store=store, auth="none", clock=FakeClock())
    # Another scheduled handler's route, and a task route of the same name.
    assert resume(other, run_id, 1, route="/jobs/other").status_code == 400
    assert resume(other, run_id, 1, route="/tasks/nightly").status_code == 400
    assert len(seen) == 1  # Only the run's own first delivery ran.
    record = store.get(run_id)
    assert record is not None and steps.continuation_of(record).seq == 1


def test_a_scheduled_continuation_naming_a_task_run_is_rejected(store: SqliteStore) -> None:
    router = Router()
    ran: list[str] = []

    @router.task("nightly")
    def task(payload: Any, ctx: TaskContext) -> None:
        ran.append("task")
        ctx.continue_later(None)

    router.scheduled("nightly")(lambda ctx: ran.append("job"))
    router.use_producer(CapturingProducer())  # type: ignore[arg-type]
    app = create_app(router, store=store, auth="none", clock=FakeClock())
    app.test_client().post("/tasks/nightly", headers=task_headers(task="t-1"), data=b"{}")
    task_run = DeliveryIdentity(Kind.TASK, "nightly", queue="default", task_name="t-1").run_id
    assert resume(app, task_run, 1).status_code == 400  # On the job's route: not its run.
    assert ran == ["task"]


def test_a_continuation_of_a_finished_scheduled_run_is_answered_as_a_duplicate(
    store: SqliteStore,
) -> None:
    seen: list[Any] = []
    app, _ = continuing_app(store, seen)
    run_id = scheduled_run_id()
    fire(app)
    for seq in (1, 2, 3):
        resume(app, run_id, seq)
    for seq in (1, 3, 4, 9):
        stray = resume(app, run_id, seq, retry=2)
        assert (stray.status_code, outcome(stray)) == (200, "duplicate")
    assert len(seen) == 4


def test_a_continuation_on_the_jobs_route_needs_the_cloud_tasks_headers(
    store: SqliteStore,
) -> None:
    app, _ = continuing_app(store, [])
    run_id = scheduled_run_id()
    fire(app)
    headers = {**job_headers(schedule_time=SLOT), protocol.CONTINUATION_HEADER: f"{run_id}:1"}
    reply = app.test_client().post("/jobs/nightly", headers=headers)
    assert reply.status_code == 400
    assert "X-CloudTasks-QueueName" in reply.get_json()["message"]


def test_an_exclusive_jobs_continuation_waits_for_the_job_rather_than_being_skipped(
    store: SqliteStore,
) -> None:
    seen: list[Any] = []
    app, _ = continuing_app(store, seen, exclusive=True)
    run_id = scheduled_run_id()
    fire(app)
    # The next slot's run takes the job lock between two deliveries of the chain, and holds it.
    router = Router()

    @router.scheduled("nightly", exclusive=True)
    def holder(ctx: TaskContext) -> None:
        waiting = resume(app, run_id, 1)
        seen.append((outcome(waiting), waiting.status_code))

    later = create_app(router, store=store, auth="none", clock=FakeClock())
    next_slot = job_headers(schedule_time="2026-10-16T13:00:00Z")
    later.test_client().post("/jobs/nightly", headers=next_slot)
    assert seen[-1] == ("in_progress", 409)
    assert outcome(resume(app, run_id, 1, retry=1)) == "processed"  # The job is free again.
    record = store.get(run_id)
    assert record is not None and steps.continuation_of(record).seq == 2


def test_a_transactional_scheduled_handler_may_not_continue(store: SqliteStore) -> None:
    router = Router()

    @router.scheduled("nightly", transactional=True)
    def nightly(ctx: TaskContext) -> None:
        ctx.continue_later({"page": 1})

    app = create_app(router, store=store, auth="none", clock=FakeClock())
    reply = fire(app)
    assert outcome(reply) == "failed"
    assert "transactional=True" in reply.get_json()["message"]


def test_runs_show_lists_a_scheduled_runs_continuation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tasklease import cli  # noqa: PLC0415

    store = SqliteStore(tmp_path / "shown.db")
    app, _ = continuing_app(store, [])
    fire(app)
    resume(app, scheduled_run_id(), 1)
    store.close()
    url = f"sqlite:///{tmp_path / 'shown.db'}"
    assert cli.main(["runs", "show", scheduled_run_id(), "--store", url]) == 0
    text = capsys.readouterr().out
    assert "continuation       2" in text and "delay 30.0 s" in text
    assert "nightly" in text
    assert cli.main(["runs", "show", scheduled_run_id(), "--store", url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["continuation"]["seq"] == 2
    assert shown["kind"] == "scheduler"


def test_the_dashboard_shows_a_scheduled_runs_continuation(tmp_path: Path) -> None:
    from tasklease.worker.dashboard import create_dashboard_app  # noqa: PLC0415

    store = SqliteStore(tmp_path / "dash.db")
    app, _ = continuing_app(store, [])
    fire(app)
    page = create_dashboard_app(store).test_client().get(f"/runs/{scheduled_run_id()}")
    assert page.status_code == 200
    assert "Continuation 1 recorded" in page.text and "delay 30.0 s" in page.text


def test_t0_is_the_slot_these_tests_fire() -> None:
    assert datetime.fromisoformat(SLOT.replace("Z", "+00:00")) == T0


def test_a_manual_runs_continuation_resumes_the_manual_run_and_the_slot_still_runs(
    store: SqliteStore,
) -> None:
    seen: list[Any] = []
    app, producer = continuing_app(store, seen)
    ahead = "2026-10-16T15:00:00Z"  # Three hours after the clock: "jobs run" sends this.
    manual = app.test_client().post("/jobs/nightly", headers=job_headers(schedule_time=ahead))
    assert outcome(manual) == "processed"
    (key,) = producer.tasks
    run_id = producer.tasks[key]["headers"][protocol.CONTINUATION_HEADER].split(":")[0]
    for seq in (1, 2, 3):
        assert outcome(resume(app, run_id, seq)) == "processed"
    record = store.get(run_id)
    assert record is not None and record.status is RunStatus.COMPLETED
    assert record.identity["trigger"] == "manual"
    assert [n for n, *_ in seen] == [0, 1, 2, 3]
    assert {r for _, _, r, *_ in seen} == {run_id}
    # The slot's own delivery, when it comes, is a run of its own.
    clock_at_slot = FakeClock(datetime.fromisoformat(ahead.replace("Z", "+00:00")))
    router = Router()
    router.scheduled("nightly")(lambda ctx: seen.append(("slot", ctx.run_id)))
    slot = create_app(router, store=store, auth="none", clock=clock_at_slot).test_client()
    assert outcome(slot.post("/jobs/nightly", headers=job_headers(schedule_time=ahead))) == (
        "processed"
    )
    assert seen[-1][0] == "slot" and seen[-1][1] != run_id
