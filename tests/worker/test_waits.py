"""Durable waits through the worker: ``ctx.wait_for`` and ``tasklease.signal`` under
duplicates, lost answers, early timeout tasks, signals before the wait and signals sent twice."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease import protocol
from tasklease.errors import StoreUnavailable
from tasklease.testing.stubs import StubQueue, StubScheduler
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core import waits
from tasklease.worker.core.records import RunStatus
from tasklease.worker.handlers.waits import WaitTimedOut
from tasklease.worker.operate.signals import send_signal, signal
from tasklease.worker.stores import MemoryStore, SqliteStore, store_from_url
from tasklease.worker.stores.base.store import LeaseStore
from tests.support.helpers import task_headers


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LeaseStore]:
    made: LeaseStore
    if request.param == "memory":
        made = MemoryStore()
    elif request.param == "sqlite":
        made = SqliteStore(tmp_path / "r.db")
    else:  # The test's clock decides, not the server's: it moves past the timeouts.
        made = store_from_url(request.getfixturevalue("postgres_url") + "&server_clock=off")
    yield made
    made.close()


class Clock:
    """A clock the test moves: the worker's and the signal's."""

    def __init__(self) -> None:
        self.now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


class Approval:
    """A handler that asks, waits for ``approval``, then records the decision."""

    def __init__(self, timeout: float | None = 3600) -> None:
        self.router = Router()
        self.calls: Counter[str] = Counter()
        self.decisions: list[Any] = []

        @self.router.task("approve")
        def approve(payload: dict[str, Any], ctx: TaskContext) -> Any:
            self.calls["handler"] += 1
            ctx.step("ask", lambda: self.calls.update(["ask"]))
            try:
                decision = ctx.wait_for("approval", timeout=timeout)
            except WaitTimedOut:
                decision = "timed out"
            self.calls["after"] += 1
            ctx.step("act", lambda: self.decisions.append((payload["order"], decision)))
            return decision


def only_run(store: LeaseStore) -> str:
    (record,) = store.list_runs()
    return record.run_id


def setup(
    flow: Approval, store: LeaseStore, clock: Clock
) -> tuple[StubQueue, Any, Callable[..., bool]]:
    queue = StubQueue(max_attempts=5).bind(flow.router)
    client = create_app(flow.router, store=store, auth="none", clock=clock).test_client()

    def send(name: str, payload: Any) -> bool:
        return signal(only_run(store), name, payload, store=store, producer=queue.producer)

    return queue, client, send


def test_a_signal_resumes_the_waiting_run_once_and_steps_before_the_wait_do_not_rerun(
    store: LeaseStore,
) -> None:
    flow, clock = Approval(), Clock()
    queue, client, send = setup(flow, store, clock)
    queue.producer.enqueue("approve", {"order": 7}, key="o-7")
    queue.drain(client, duplicate_every=2, lose_response_every=3)
    record = store.get(only_run(store))
    assert record is not None and record.status is RunStatus.WAITING
    assert flow.calls == Counter(handler=flow.calls["handler"], ask=1)
    assert send("approval", {"ok": True}) is True
    assert send("approval", {"ok": False}) is True  # Sent twice: resumes once, first payload.
    queue.drain(client, duplicate_every=2, lose_response_every=3)
    assert flow.decisions == [(7, {"ok": True})]
    assert flow.calls["ask"] == 1
    record = store.get(only_run(store))
    assert record is not None and record.status is RunStatus.COMPLETED
    assert record.result == {"ok": True}
    assert send("approval", {"ok": True}) is False  # The run has ended.
    queue.close()


def test_a_signal_before_the_wait_resumes_without_a_second_delivery(store: LeaseStore) -> None:
    clock = Clock()
    router = Router()
    calls: Counter[str] = Counter()

    @router.task("later")
    def later(payload: Any, ctx: TaskContext) -> Any:
        calls["handler"] += 1
        if ctx.attempt == 1:
            raise RuntimeError("released before the wait")
        return ctx.wait_for("go")

    queue = StubQueue(max_attempts=1).bind(router)  # The first answer ends the task.
    client = create_app(router, store=store, auth="none", clock=clock).test_client()
    queue.producer.enqueue("later", None, key="l")
    queue.drain(client)
    run_id = only_run(store)
    assert signal(run_id, "go", "early bird", store=store, producer=queue.producer) is True
    assert [task.handler for task in queue.pending()] == []  # Not waiting yet: no resume task.
    record = store.get(run_id)
    assert record is not None and record.status is RunStatus.RELEASED
    assert waits.waits_of(record).signals["go"].payload_json == '"early bird"'
    # The task's next delivery reaches the wait: the kept signal answers it at once.
    queue.max_attempts = 5
    queue.redeliver()
    queue.drain(client)
    record = store.get(run_id)
    assert record is not None and record.status is RunStatus.COMPLETED
    assert record.result == "early bird"
    assert calls["handler"] == 2
    queue.close()


def test_a_timeout_task_delivered_before_its_deadline_does_not_resume(store: LeaseStore) -> None:
    flow, clock = Approval(timeout=600), Clock()
    queue, client, _ = setup(flow, store, clock)
    queue.producer.enqueue("approve", {"order": 1}, key="o-1")
    summary = queue.drain(client)  # Delivers the timeout task at once, five times: all early.
    early = [d for d in summary.deliveries if d.status == 409]
    assert early and all(d.outcome == "in_progress" for d in early)
    record = store.get(only_run(store))
    assert record is not None and record.status is RunStatus.WAITING
    assert flow.calls["after"] == 0
    # Past the deadline, the timeout task's next delivery resumes the run with the timeout.
    clock.now += timedelta(minutes=11)
    queue.redeliver()  # Cloud Tasks retries it with its backoff.
    queue.drain(client)
    assert flow.decisions == [(1, "timed out")]
    assert flow.calls["ask"] == 1
    queue.close()


def test_a_signal_after_the_timeout_resumes_nothing(store: LeaseStore) -> None:
    flow, clock = Approval(timeout=60), Clock()
    queue, client, send = setup(flow, store, clock)
    queue.producer.enqueue("approve", {"order": 2}, key="o-2")
    queue.drain(client)
    clock.now += timedelta(minutes=2)
    queue.redeliver()
    queue.drain(client)
    assert flow.decisions == [(2, "timed out")]
    decision = send_signal(
        only_run(store), "approval", True, store=store, producer=queue.producer, clock=clock
    )
    assert decision.outcome is waits.Signalled.ENDED
    assert send("approval", True) is False
    queue.close()


def test_the_resume_task_carries_the_resume_header_and_no_payload(store: LeaseStore) -> None:
    flow, clock = Approval(timeout=None), Clock()
    queue, client, send = setup(flow, store, clock)
    queue.producer.enqueue("approve", {"order": 3}, key="o-3")
    queue.drain(client)
    assert len(queue.tasks) == 1  # No timeout: no timeout task.
    assert send("approval", "yes")
    resume = queue.tasks[-1]
    assert resume.request.headers[protocol.RESUME_HEADER].startswith(only_run(store))
    assert resume.payload is None
    queue.drain(client)
    assert flow.decisions == [(3, "yes")]
    queue.close()


def test_an_async_handler_waits_with_await_for(store: LeaseStore) -> None:
    clock, router = Clock(), Router()
    calls: Counter[str] = Counter()

    @router.task("async_approve")
    async def async_approve(payload: Any, ctx: TaskContext) -> Any:
        await ctx.astep("ask", lambda: calls.update(["ask"]))
        return await ctx.await_for("approval", timeout=timedelta(hours=1))

    queue = StubQueue(max_attempts=2).bind(router)
    client = create_app(router, store=store, auth="none", clock=clock).test_client()
    queue.producer.enqueue("async_approve", {}, key="a")
    queue.drain(client)
    assert signal(only_run(store), "approval", [1, 2], store=store, producer=queue.producer)
    queue.drain(client)
    record = store.get(only_run(store))
    assert record is not None and record.status is RunStatus.COMPLETED
    assert record.result == [1, 2] and calls["ask"] == 1
    queue.close()


def test_a_scheduled_run_waits_and_resumes_on_its_job_route(store: LeaseStore) -> None:
    clock, router = Clock(), Router()
    done: list[Any] = []

    @router.scheduled("nightly", schedule="0 3 * * *")
    def nightly(ctx: TaskContext) -> None:
        done.append((ctx.job_name, ctx.wait_for("go")))

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none", clock=clock).test_client()
    scheduler = StubScheduler().bind(router)
    scheduler.fire(client, "nightly", datetime(2026, 12, 4, 3, 0, tzinfo=UTC))
    run_id = only_run(store)
    assert signal(run_id, "go", "now", store=store, producer=queue.producer)
    (resume,) = queue.tasks
    assert resume.request.url.endswith("/jobs/nightly")
    queue.drain(client)
    assert done == [("nightly", "now")]
    queue.close()


def test_a_fan_in_child_that_waits_is_counted_when_it_resumes_and_ends(
    store: LeaseStore,
) -> None:
    clock, router = Clock(), Router()
    then: list[dict[str, Any]] = []

    @router.task("parent")
    def parent(payload: Any, ctx: TaskContext) -> None:
        ctx.fan_out("child", [("a", 1), ("b", 2)], then="joined")

    @router.task("child")
    def child(payload: int, ctx: TaskContext) -> int:
        return payload * int(ctx.wait_for("factor"))

    @router.task("joined")
    def joined(payload: dict[str, Any], ctx: TaskContext) -> None:
        then.append(payload)

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none", clock=clock).test_client()
    queue.producer.enqueue("parent", None, key="p")
    queue.drain(client)
    waiting = [r for r in store.list_runs(RunStatus.WAITING)]
    assert len(waiting) == 2 and then == []
    for record in waiting:
        assert signal(record.run_id, "factor", 10, store=store, producer=queue.producer)
    queue.drain(client, duplicate_every=2, lose_response_every=3)
    (payload,) = then
    assert sorted(r["result"] for r in payload["results"]) == [10, 20]
    queue.close()


def test_a_continued_run_waits_in_its_second_delivery(store: LeaseStore) -> None:
    clock, router = Clock(), Router()
    seen: list[Any] = []

    @router.task("chain")
    def chain(payload: Any, ctx: TaskContext) -> Any:
        if ctx.continuation == 0:
            ctx.continue_later({"step": 1})
            return None
        seen.append(ctx.state)
        return ctx.wait_for("go")

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none", clock=clock).test_client()
    queue.producer.enqueue("chain", None, key="c")
    queue.drain(client)
    run_id = only_run(store)
    assert signal(run_id, "go", "done", store=store, producer=queue.producer)
    assert queue.tasks[-1].request.headers[protocol.RESUME_HEADER].startswith(f"{run_id}:1:")
    queue.drain(client, duplicate_every=2)
    record = store.get(run_id)
    assert record is not None and record.status is RunStatus.COMPLETED and record.result == "done"
    assert seen and all(state == {"step": 1} for state in seen)
    queue.close()


def test_an_uncaught_timeout_fails_the_run_for_good(store: LeaseStore) -> None:
    clock, router = Clock(), Router()

    @router.task("strict")
    def strict(payload: Any, ctx: TaskContext) -> Any:
        return ctx.wait_for("go", timeout=30)

    queue = StubQueue(max_attempts=2).bind(router)
    client = create_app(router, store=store, auth="none", clock=clock).test_client()
    queue.producer.enqueue("strict", None, key="s")
    queue.drain(client)
    clock.now += timedelta(minutes=1)
    queue.redeliver()
    queue.drain(client)
    record = store.get(only_run(store))
    assert record is not None and record.status is RunStatus.FAILED
    assert record.error is not None and "timed out before its signal came" in record.error
    queue.close()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ctx: ctx.wait_for(""), "a non-empty string"),
        (lambda ctx: ctx.wait_for("go", timeout=-1), "between 0 and 30 days"),
        (lambda ctx: ctx.wait_for("go", timeout=timedelta(days=31)), "between 0 and 30 days"),
        (lambda ctx: ctx.step("inner", lambda: ctx.wait_for("go")), "inside a step"),
        (lambda ctx: (ctx.continue_later(), ctx.wait_for("go")), "continue_later"),
    ],
)
def test_a_wait_against_the_rules_fails_the_run_naming_the_fix(
    store: LeaseStore, call: Callable[[TaskContext], Any], message: str
) -> None:
    router = Router()

    @router.task("broken")
    def broken(payload: Any, ctx: TaskContext) -> Any:
        return call(ctx)

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("broken", None, key="b")
    queue.drain(client)
    record = store.get(only_run(store))
    assert record is not None and record.status is RunStatus.FAILED
    assert record.error is not None and message in record.error
    queue.close()


def test_a_wait_name_is_used_once_per_run(store: LeaseStore) -> None:
    router = Router()

    @router.task("loop")
    def loop(payload: Any, ctx: TaskContext) -> Any:
        ctx.wait_for("reply")
        if ctx.continuation == 0:
            ctx.continue_later()
            return None
        return ctx.wait_for("reply")  # The same name in the next delivery: refused.

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("loop", None, key="l")
    queue.drain(client)
    assert signal(only_run(store), "reply", 1, store=store, producer=queue.producer)
    queue.drain(client)
    record = store.get(only_run(store))
    assert record is not None and record.status is RunStatus.FAILED
    assert record.error is not None and "used once per run" in record.error
    queue.close()


def test_a_signal_sent_while_the_handler_runs_resumes_the_run_it_suspends(
    store: LeaseStore,
) -> None:
    router = Router()
    queue = StubQueue().bind(router)
    results: list[Any] = []

    @router.task("racy")
    def racy(payload: Any, ctx: TaskContext) -> Any:
        if not results:  # The signal lands after the claim, before the wait is recorded.
            results.append(signal(ctx.run_id, "go", "raced", store=store, producer=queue.producer))
        return ctx.wait_for("go")

    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("racy", None, key="r")
    queue.drain(client)
    record = store.get(only_run(store))
    assert results == [True]
    assert record is not None and record.status is RunStatus.COMPLETED and record.result == "raced"
    queue.close()


def test_the_how_to_pages_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    page = (Path(__file__).parents[2] / "docs" / "how-to" / "waits.md").read_text()
    example = page.split("```python\n", 1)[1].split("\n```", 1)[0]
    expected = "\n".join(
        line.removeprefix("# ") for line in example.splitlines() if line.startswith("# ")
    )
    script = tmp_path / "approval.py"
    script.write_text(example)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == expected


class LandsUnheard(MemoryStore):
    """A store whose first suspension lands and whose answer is lost; ``meanwhile`` runs
    between the two (another delivery, before the suspending one retries its write)."""

    def __init__(self) -> None:
        super().__init__()
        self.meanwhile: Callable[[], None] = lambda: None
        self.suspensions = 0

    def suspend(self, *args: Any, **kwargs: Any) -> Any:
        record = super().suspend(*args, **kwargs)
        self.suspensions += 1
        if self.suspensions == 1:
            self.meanwhile()
            raise StoreUnavailable("the answer of suspend was lost")
        return record


def test_a_suspension_that_landed_unheard_is_answered_waiting_after_the_run_resumed() -> None:
    store, router, ran = LandsUnheard(), Router(), Counter[str]()

    @router.task("approve")
    def approve(payload: Any, ctx: TaskContext) -> Any:
        ran["handler"] += 1
        return ctx.wait_for("go")

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()

    def resume_meanwhile() -> None:  # The signal comes, and its resume runs the run.
        assert signal(only_run(store), "go", "yes", store=store, producer=queue.producer)
        queue.drain(client)

    store.meanwhile = resume_meanwhile
    first = client.post(
        f"{protocol.TASK_ROUTE_PREFIX}approve", data=b"null", headers=task_headers(task="t-1")
    )
    record = store.get(only_run(store))
    assert record is not None and record.status is RunStatus.COMPLETED and record.result == "yes"
    assert ran["handler"] == 2
    # Its suspension was recorded: the run waited, and was resumed by the signal meanwhile.
    assert first.status_code == 200, first.get_json()
    assert first.get_json()["outcome"] == "waiting"
    queue.close()


def test_a_signal_retries_a_store_out_of_reach_with_the_callers_sleep() -> None:
    store, router, slept = SwitchedOff(), Router(), list[float]()
    router.task("approve")(lambda payload, ctx: ctx.wait_for("go"))
    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("approve", None, key="a")
    queue.drain(client)
    store.refusals = 2
    decision = send_signal(
        only_run(store), "go", 1, store=store, producer=queue.producer, sleep=slept.append
    )
    assert decision.outcome is waits.Signalled.RESUMES
    assert slept == [0.05, 0.2]  # Its own pauses, not the process's: a clock of its own.
    queue.close()


class SwitchedOff(MemoryStore):
    """A store whose next ``refusals`` signals find it out of reach."""

    refusals = 0

    def signal_run(self, *args: Any, **kwargs: Any) -> Any:
        if self.refusals:
            self.refusals -= 1
            raise StoreUnavailable("out of reach")
        return super().signal_run(*args, **kwargs)
