"""Cancelling runs through the real executor: a run nothing runs never runs again, a running
one stops at its next step or renewal and ends ``cancelled`` without a retry, and a cancelled
parent's pending fan-out children never run, nor does its join's ``then``."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import flask
import psycopg
import pytest

import tasklease
from tasklease import protocol
from tasklease.errors import Cancelled, ConfigurationError
from tasklease.testing.contract_support import claim_request
from tasklease.testing.stubs import StubQueue
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.identity import DeliveryIdentity, Kind
from tasklease.worker.core.records import RunRecord, RunStatus, Verdict
from tasklease.worker.stores import SqliteStore
from tasklease.worker.stores.base.fan_ins import FanInStore
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support.helpers import FakeClock, task_headers, wait_for

BY = "ops@example.com"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FanInStore]:
    made: FanInStore
    if request.param == "sqlite":
        made = SqliteStore(tmp_path / "runs.db")
    else:
        url = request.getfixturevalue("postgres_url")
        made = PostgresStore.from_url(url)
    yield made
    made.close()


def run_id_of(task: str, handler: str = "h") -> str:
    return DeliveryIdentity(Kind.TASK, handler, queue="default", task_name=task).run_id


def post(app: flask.Flask, task: str, *, retry: int = 0, handler: str = "h") -> Any:
    return app.test_client().post(
        f"/tasks/{handler}", headers=task_headers(task=task, retry=retry), data=b"{}"
    )


def answer(response: Any) -> tuple[int, str]:
    return response.status_code, response.headers[protocol.OUTCOME_HEADER]


def stored(store: FanInStore, run_id: str) -> RunRecord:
    record = store.get(run_id)
    assert record is not None
    return record


def test_a_released_run_is_cancelled_and_its_retry_answered_200_without_running(
    store: FanInStore,
) -> None:
    router = Router()
    calls: list[int] = []

    @router.task("h")
    def handler(payload: Any, ctx: TaskContext) -> None:
        calls.append(ctx.attempt)
        raise RuntimeError("try again")

    app = create_app(router, store=store, auth="none")
    assert answer(post(app, "t-1")) == (500, "released")
    run_id = run_id_of("t-1")
    assert tasklease.cancel(run_id, store=store, by=BY) is True
    for retry in (1, 2):  # The retry, and a duplicate of it.
        assert answer(post(app, "t-1", retry=retry)) == (200, "cancelled")
    assert calls == [1]
    record = stored(store, run_id)
    assert (record.status, record.cancelled_by) == (RunStatus.CANCELLED, BY)
    assert record.cancelled_at is not None and record.error == f"cancelled by {BY}"


class PausingClient:
    """Cancels the run before the first delivery of its first continuation reaches the
    worker: the run is between continuations."""

    def __init__(self, client: Any, store: FanInStore) -> None:
        self.client = client
        self.store = store
        self.cancelled = False

    def post(self, path: str, *, headers: dict[str, str], data: bytes) -> Any:
        continues = headers.get(protocol.CONTINUATION_HEADER)
        if continues and not self.cancelled:
            self.cancelled = tasklease.cancel(continues.split(":")[0], store=self.store, by=BY)
        return self.client.post(path, headers=headers, data=data)


def test_a_run_between_continuations_never_resumes(store: FanInStore) -> None:
    router = Router()
    deliveries: list[int] = []

    @router.task("pages")
    def pages(payload: Any, ctx: TaskContext) -> str:
        deliveries.append(ctx.continuation)
        if ctx.continuation < 3:
            ctx.continue_later({"page": ctx.continuation + 1})
        return "done"

    queue = StubQueue().bind(router)
    client = PausingClient(create_app(router, store=store, auth="none").test_client(), store)
    queue.producer.enqueue("pages", {}, key="export")
    summary = queue.drain(client, duplicate_every=2, lose_response_every=3)
    assert client.cancelled
    assert deliveries == [0]
    assert summary.outcomes["cancelled"] >= 1
    assert not queue.pending() and not summary.given_up
    (record,) = store.list_runs()
    assert (record.status, record.cancelled_by) == (RunStatus.CANCELLED, BY)
    queue.close()


def test_a_waiting_run_is_cancelled_and_never_resumes(store: FanInStore) -> None:
    router = Router()
    calls: list[int] = []

    @router.task("h")
    def handler(payload: Any, ctx: TaskContext) -> None:
        calls.append(ctx.attempt)

    app = create_app(router, store=store, auth="none")
    run_id = run_id_of("t-1")
    clock = FakeClock(datetime.now(UTC))
    request = claim_request(run_id, "a-1", handler="h", identity={"queue": "default"})
    assert store.claim(request, clock()).verdict is Verdict.CLAIMED
    assert store.suspend(run_id, "a-1", None, "{}", clock()) is not None
    assert tasklease.cancel(run_id, store=store, by=BY)
    assert answer(post(app, "t-1", retry=1)) == (200, "cancelled")
    assert calls == []
    assert stored(store, run_id).status is RunStatus.CANCELLED


class Operator:
    """Cancels the run from inside its first step, as an operator would while it runs."""

    def __init__(self, store: FanInStore) -> None:
        self.store = store
        self.answers: list[bool] = []

    def cancel(self, run_id: str) -> str:
        self.answers.append(tasklease.cancel(run_id, store=self.store, by=BY))
        return "charged"


def test_a_running_run_stops_at_its_next_step_and_ends_cancelled_without_a_retry(
    store: FanInStore,
) -> None:
    router = Router()
    operator = Operator(store)
    seen: Counter[str] = Counter()

    @router.task("h")
    def handler(payload: Any, ctx: TaskContext) -> str:
        seen["started"] += 1
        ctx.step("charge", operator.cancel, ctx.run_id)  # Its write returns the mark.
        seen["cancelled" if ctx.cancelled else "not cancelled"] += 1
        try:
            ctx.step("ship", lambda: seen.update(["shipped"]))
        except Cancelled:
            seen["raised"] += 1
        return "the handler returns; the run is cancelled anyway"

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("h", {}, key="order-1")
    summary = queue.drain(client, duplicate_every=1, lose_response_every=2)
    assert seen == Counter(started=1, cancelled=1, raised=1)
    assert operator.answers == [True]  # Marked: the attempt held the run.
    assert summary.outcomes["cancelled"] >= 2  # The run's end, then its retries'.
    assert "released" not in summary.outcomes and not queue.pending()
    (record,) = store.list_runs()
    assert (record.status, record.attempts, record.cancelled_by) == (RunStatus.CANCELLED, 1, BY)
    queue.close()


@pytest.mark.parametrize("ending", ["raises", "returns"])
def test_a_handler_that_saw_the_cancellation_at_a_renewal_ends_cancelled(
    store: FanInStore, ending: str
) -> None:
    router = Router()
    started = threading.Event()
    seen: list[bool] = []

    @router.task("h", lease=timedelta(seconds=1))
    def handler(payload: Any, ctx: TaskContext) -> None:
        started.set()
        seen.append(wait_for(lambda: ctx.cancelled))  # Learnt from a renewal: no step.
        if ending == "raises":
            raise RuntimeError("stopping")

    app = create_app(router, store=store, auth="none")
    run_id = run_id_of("t-1")
    stopping = threading.Thread(target=lambda: started.wait(10) and cancel_when_held(store, run_id))
    stopping.start()
    assert answer(post(app, "t-1")) == (200, "cancelled")
    stopping.join()
    assert seen == [True]
    assert stored(store, run_id).status is RunStatus.CANCELLED
    assert answer(post(app, "t-1", retry=1)) == (200, "cancelled")
    assert len(seen) == 1


def cancel_when_held(store: FanInStore, run_id: str) -> bool:
    assert wait_for(lambda: store.get(run_id) is not None)
    return tasklease.cancel(run_id, store=store, by=BY)


def test_a_transactional_handler_that_saw_the_cancellation_rolls_back(postgres_url: str) -> None:
    """Postgres: its renewals are not held up by the handler's transaction (SQLite's are, so
    a transactional handler there learns of a cancellation only after it commits)."""
    store = PostgresStore.from_url(postgres_url)
    store.get("warm-up")  # Creates the schema.
    effects = f'"{store.options.schema}".effects'
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {effects} (n integer)")
    router = Router()
    started = threading.Event()

    @router.task("h", transactional=True, lease=timedelta(seconds=1))
    def handler(payload: Any, ctx: TaskContext) -> str:
        ctx.transaction.execute(f"INSERT INTO {effects} VALUES (1)")
        started.set()
        assert wait_for(lambda: ctx.cancelled)
        return "would commit"

    app = create_app(router, store=store, auth="none")
    run_id = run_id_of("t-1")
    stopping = threading.Thread(target=lambda: started.wait(10) and cancel_when_held(store, run_id))
    stopping.start()
    response = post(app, "t-1")
    stopping.join()
    assert answer(response) == (200, "cancelled")
    record = stored(store, run_id)
    assert record.status is RunStatus.CANCELLED and record.result_json is None
    with psycopg.connect(store._conninfo, autocommit=True) as connection:
        row = connection.execute(f"SELECT count(*) FROM {effects}").fetchone()
    assert row == (0,)  # Rolled back with the handler's transaction.
    store.close()


def test_a_run_whose_holder_died_after_the_mark_is_ended_by_its_next_delivery(
    store: FanInStore,
) -> None:
    router = Router()
    calls: list[int] = []

    @router.task("h")
    def handler(payload: Any, ctx: TaskContext) -> None:
        calls.append(ctx.attempt)

    clock = FakeClock(datetime.now(UTC))
    app = create_app(router, store=store, auth="none", clock=clock)
    run_id = run_id_of("t-1")
    request = claim_request(run_id, "died", handler="h", identity={"queue": "default"})
    assert store.claim(request, clock()).verdict is Verdict.CLAIMED
    assert tasklease.cancel(run_id, store=store, by=BY)  # Marked: "died" holds it.
    assert stored(store, run_id).status is RunStatus.IN_PROGRESS
    assert answer(post(app, "t-1", retry=1)) == (409, "in_progress")  # Its lease holds.
    clock.advance(timedelta(minutes=10))
    assert answer(post(app, "t-1", retry=2)) == (200, "cancelled")
    record = stored(store, run_id)
    assert (record.status, record.cancelled_by) == (RunStatus.CANCELLED, BY)
    assert calls == []


class Family:
    """A parent that fans out ``count`` children (with a join when ``then``), and is then
    cancelled by its operator before its next step."""

    def __init__(self, store: FanInStore, count: int, *, then: bool) -> None:
        self.router = Router()
        self.children: Counter[int] = Counter()
        self.thens: list[Any] = []

        @self.router.task("parent")
        def parent(payload: Any, ctx: TaskContext) -> None:
            items = [(f"c{n}", {"n": n}) for n in range(count)]
            ctx.step(
                "fan out", lambda: len(ctx.fan_out("child", items, then="after" if then else None))
            )
            tasklease.cancel(ctx.run_id, store=store, by=BY)
            ctx.step("marked", lambda: None)  # Learns of it here,
            ctx.step("never", lambda: None)  # and stops here.

        @self.router.task("child")
        def child(payload: dict[str, int], ctx: TaskContext) -> None:
            self.children[payload["n"]] += 1

        @self.router.task("after")
        def after(payload: Any, ctx: TaskContext) -> None:
            self.thens.append(payload)


@pytest.mark.parametrize("then", [False, True])
def test_a_cancelled_parents_pending_children_never_run_nor_does_its_then(
    store: FanInStore, then: bool
) -> None:
    family = Family(store, 5, then=then)
    queue = StubQueue().bind(family.router)
    client = create_app(family.router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", {}, key="p")
    summary = queue.drain(client, duplicate_every=3, lose_response_every=4)
    assert family.children == Counter() and family.thens == []
    assert not queue.pending() and not summary.given_up
    assert {task.handler for task in queue.tasks} == {"parent", "child"}
    runs = store.list_runs()
    assert len(runs) == 6 and {run.status for run in runs} == {RunStatus.CANCELLED}
    parent = next(run for run in runs if run.handler == "parent")
    children = [run for run in runs if run.handler == "child"]
    assert {run.cancelled_by for run in children} == {
        f"the cancellation of its parent run {parent.run_id}"
    }
    if then:
        (join,) = store.fan_ins_of(parent.run_id)
        assert (join.failed, join.closed, join.then_enqueued_at) == (5, True, None)
    queue.close()


def test_a_cancelled_child_still_lets_its_join_close_and_then_run(store: FanInStore) -> None:
    router = Router()
    thens: list[dict[str, Any]] = []
    ran: list[str] = []

    @router.task("parent")
    def parent(payload: Any, ctx: TaskContext) -> None:
        ctx.fan_out("child", [("a", "a"), ("b", "b")], then="after")

    @router.task("child")
    def child(payload: str, ctx: TaskContext) -> str:
        ran.append(payload)
        if payload == "b":
            raise RuntimeError("b fails once; its retry finds it cancelled")
        return payload

    @router.task("after")
    def after(payload: dict[str, Any], ctx: TaskContext) -> None:
        thens.append(payload)

    class CancelsChildB:
        def __init__(self, client: Any) -> None:
            self.client = client

        def post(self, path: str, *, headers: dict[str, str], data: bytes) -> Any:
            response = self.client.post(path, headers=headers, data=data)
            if response.headers[protocol.OUTCOME_HEADER] == "released":
                run_id = response.headers[protocol.RUN_ID_HEADER]
                assert tasklease.cancel(run_id, store=store, by=BY)
            return response

    queue = StubQueue().bind(router)
    client = CancelsChildB(create_app(router, store=store, auth="none").test_client())
    queue.producer.enqueue("parent", None, key="p")
    queue.drain(client, duplicate_every=2)
    assert sorted(ran) == ["a", "b"]  # b once: its retries found it cancelled.
    (payload,) = thens
    assert payload["summary"] == {"total": 2, "completed": 1, "failed": 1}
    statuses = {r["key"]: (r["status"], r["error"]) for r in payload["results"]}
    assert statuses == {"a": ("completed", None), "b": ("cancelled", f"cancelled by {BY}")}
    queue.close()


def test_a_finished_or_unknown_run_is_not_cancelled(store: FanInStore) -> None:
    router = Router()
    router.task("h")(lambda payload, ctx: "done")
    app = create_app(router, store=store, auth="none")
    assert answer(post(app, "t-1")) == (200, "processed")
    run_id = run_id_of("t-1")
    before = stored(store, run_id)
    assert tasklease.cancel(run_id, store=store, by=BY) is False
    assert store.get(run_id) == before
    assert tasklease.cancel("no-such-run", store=store) is False
    assert answer(post(app, "t-1", retry=1)) == (200, "duplicate")


@pytest.mark.parametrize(
    ("run_id", "by", "named"),
    [
        ("", BY, "give the run id"),
        ("r-1", "  ", "name who cancels"),
        ("r-1", "x" * 201, "give a shorter name"),
    ],
)
def test_a_cancel_with_bad_arguments_is_refused_naming_the_fix(
    store: FanInStore, run_id: str, by: str, named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named):
        tasklease.cancel(run_id, store=store, by=by)


def test_the_top_package_exports_cancel_and_its_error() -> None:
    assert tasklease.cancel is tasklease.worker.operate.cancels.cancel
    assert issubclass(tasklease.Cancelled, tasklease.TaskleaseError)


def test_the_how_to_pages_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    page = (Path(__file__).parents[2] / "docs" / "how-to" / "cancellation.md").read_text()
    example = page.split("```python\n", 1)[1].split("\n```", 1)[0]
    expected = example.rsplit("# ", 1)[1].strip()
    script = tmp_path / "cancel.py"
    script.write_text(example)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == expected
