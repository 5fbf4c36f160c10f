"""Fan-in at its edges, found by an independent review: each test is a way a join's ``then``
handler could never run, run early or get a wrong result list, or a bad input be accepted
silently, and each failed before its fix. The docstrings say what the guide
(docs/how-to/fan-in.md) promises."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease.errors import ConfigurationError
from tasklease.producer import InvalidTask
from tasklease.testing.stubs import CreatedTask, StubQueue
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core import constants as c
from tasklease.worker.stores import MemoryStore, SqliteStore
from tasklease.worker.stores.base.fan_ins import FanInStore
from tests.support.helpers import FakeClock, SwitchableStore


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FanInStore]:
    made: FanInStore = (
        MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "r.db")
    )
    yield made
    made.close()


def _deliver(client: Any, task: CreatedTask) -> int:
    """One first delivery of ``task`` with the headers Cloud Tasks sends; its HTTP status."""
    request = task.request
    headers = {
        **request.headers,
        c.TASKS_QUEUE_NAME: request.queue_path.rsplit("/", 1)[-1],
        c.TASKS_TASK_NAME: request.task_id,
        c.TASKS_RETRY_COUNT: "0",
        c.TASKS_EXECUTION_COUNT: "0",
    }
    path = "/" + request.url.split("://", 1)[-1].split("/", 1)[-1]
    return int(client.post(path, headers=headers, data=request.body).status_code)


def _then_tasks(queue: StubQueue, then: str = "summarise") -> list[CreatedTask]:
    return [task for task in queue.tasks if task.handler == then]


def test_a_child_that_continues_counts_when_its_last_delivery_completes(
    store: FanInStore,
) -> None:
    """The guide: "A child that continues (ctx.continue_later) counts when its last delivery
    completes". The continuation task is enqueued without the child's fan-in header, so its
    completion is written with the plain ``complete`` and never counted: the join waits
    forever."""
    router = Router()
    joined: list[dict[str, Any]] = []

    @router.task("parent")
    def parent(payload: None, ctx: TaskContext) -> None:
        ctx.fan_out("child", [("a", 1), ("b", 2)], then="summarise")

    @router.task("child")
    def child(payload: int, ctx: TaskContext) -> int | None:
        if payload == 2 and ctx.continuation == 0:
            ctx.continue_later({"half": "done"})
            return None
        return payload * 10

    @router.task("summarise")
    def summarise(payload: dict[str, Any], ctx: TaskContext) -> None:
        joined.append(payload)

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", None, key="p")
    queue.drain(client)
    assert [[r["result"] for r in j["results"]] for j in joined] == [[10, 20]]
    queue.close()


def test_a_join_open_longer_than_its_childrens_retention_still_closes(
    store: FanInStore,
) -> None:
    """A join is kept ``retention`` past its latest count, and purged with its entries after
    that even while children are still to come (a child retried with backoff, a rate-limited
    queue). The next child then opens a fresh join, counted 1 of 2, that never closes: the
    first child's result is lost and ``then`` never runs."""
    clock = FakeClock()
    router = Router()

    @router.task("parent")
    def parent(payload: None, ctx: TaskContext) -> None:
        ctx.fan_out("child", [("a", 1), ("b", 2)], then="summarise")

    @router.task("child", retention=timedelta(hours=1))
    def child(payload: int, ctx: TaskContext) -> int:
        return payload

    @router.task("summarise")
    def summarise(payload: dict[str, Any], ctx: TaskContext) -> None:
        pass

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none", clock=clock).test_client()
    queue.producer.enqueue("parent", None, key="p")
    (parent_task,) = queue.tasks
    assert _deliver(client, parent_task) == 200
    first, second = [task for task in queue.tasks if task.handler == "child"]
    assert _deliver(client, first) == 200
    clock.advance(timedelta(hours=2))  # The second child is still being retried meanwhile.
    store.purge_expired(clock())
    assert _deliver(client, second) == 200
    assert len(_then_tasks(queue)) == 1
    queue.close()


def test_fan_in_results_after_the_join_was_purged_is_not_an_empty_list(
    store: FanInStore,
) -> None:
    """A join is kept for its children's retention, not its ``then`` handler's: a ``then``
    retried (or queued) past it finds the join purged, and ``ctx.fan_in_results`` answers
    ``[]`` as if the join had no more children. A handler paging a join of over 1,000
    children then goes on with the first page alone, silently."""
    clock = FakeClock()
    router = Router()
    seen: list[list[dict[str, Any]]] = []

    @router.task("parent")
    def parent(payload: None, ctx: TaskContext) -> None:
        ctx.fan_out("child", [("a", 1), ("b", 2)], then="summarise")

    @router.task("child", retention=timedelta(hours=1))
    def child(payload: int, ctx: TaskContext) -> int:
        return payload

    @router.task("summarise")
    def summarise(payload: dict[str, Any], ctx: TaskContext) -> None:
        if not seen:
            seen.append([])
            clock.advance(timedelta(hours=2))  # A downstream outage: retried two hours on.
            store.purge_expired(clock())
            raise RuntimeError("the report's database is down")
        try:
            seen.append(ctx.fan_in_results())
        except Exception:  # Any loud refusal is the fix.
            seen.append([{"refused": True}])

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none", clock=clock).test_client()
    queue.producer.enqueue("parent", None, key="p")
    queue.drain(client)
    assert seen[1] != [], "fan_in_results answered [] for a purged join of two children"
    queue.close()


def test_an_item_key_too_long_for_the_fan_in_header_is_refused_at_fan_out() -> None:
    """The fan-in header carries the item key percent-encoded, and the worker refuses any
    identity header over 1,024 characters. A 120-character key in a non-Latin script (9
    characters each once encoded) is accepted by ``fan_out`` (task IDs are hashed, so they
    fit), and then every delivery of that child is refused 400 as malformed: it never runs,
    never counts, and the join never closes."""
    router = Router()

    @router.task("child")
    def child(payload: int, ctx: TaskContext) -> int:
        return payload

    @router.task("summarise")
    def summarise(payload: dict[str, Any], ctx: TaskContext) -> None:
        pass

    queue = StubQueue(max_attempts=3).bind(router)
    client = create_app(router, store=MemoryStore(), auth="none").test_client()

    class Ctx:
        run_id = "outside-1"

    key = "写真" * 60
    try:
        queue.producer.fan_out(Ctx(), "child", [(key, 1), ("short", 2)], then="summarise")
    except InvalidTask:
        return  # Refused up front: the fix.
    summary = queue.drain(client)
    assert summary.given_up == []
    assert len(_then_tasks(queue)) == 1
    queue.close()


def test_every_store_tasklease_ships_keeps_joins() -> None:
    """The guide: "Every store tasklease ships keeps joins". A store that keeps none answers
    every child 500 before its claim until the queue gives up, and ``then`` never runs."""
    from tasklease.worker.stores.firestore.store import FirestoreStore  # noqa: PLC0415
    from tasklease.worker.stores.postgres.store import PostgresStore  # noqa: PLC0415
    from tasklease.worker.stores.spanner.store import SpannerStore  # noqa: PLC0415

    missing = [
        cls.__name__
        for cls in (PostgresStore, FirestoreStore, SpannerStore)
        if not issubclass(cls, FanInStore)
    ]
    assert missing == []


def test_a_fan_out_with_then_is_refused_where_the_store_keeps_no_joins() -> None:
    """A parent on a worker whose store keeps no joins fans out with ``then=`` without a
    word; its children are then answered 500 on every delivery and the join never closes.
    ``ctx.fan_out`` knows the worker's store, and could refuse (InvalidTask) before creating
    a child (ConfigurationError)."""
    router = Router()
    refused: list[str] = []

    @router.task("parent")
    def parent(payload: None, ctx: TaskContext) -> None:
        try:
            ctx.fan_out("child", [("a", 1)], then="summarise")
        except ConfigurationError as exc:
            refused.append(str(exc))

    @router.task("child")
    def child(payload: int, ctx: TaskContext) -> int:
        return payload

    @router.task("summarise")
    def summarise(payload: dict[str, Any], ctx: TaskContext) -> None:
        pass

    store = SwitchableStore(MemoryStore())  # Runs and locks, no joins.
    queue = StubQueue(max_attempts=3).bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", None, key="p")
    summary = queue.drain(client)
    assert refused or summary.given_up == [], (
        "the fan-out was accepted, and its child given up after 500s: "
        f"{summary.outcomes}, given up {summary.given_up}"
    )
    queue.close()


def test_a_child_out_of_attempts_on_the_queue_still_counts_as_failed(store: FanInStore) -> None:
    """A child's ``max_attempts`` fails its run only on the claim after the last allowed
    attempt. On a queue whose own max attempts is the same number (a natural setting), the
    queue gives the child up first: the child is never recorded failed, never counted, and
    ``then`` never runs, where the guide lists ``max_attempts`` among the ways a child ends
    ``failed`` in the results."""
    router = Router()
    joined: list[dict[str, Any]] = []

    @router.task("parent")
    def parent(payload: None, ctx: TaskContext) -> None:
        ctx.fan_out("child", [("a", 1), ("b", 2)], then="summarise")

    @router.task("child", max_attempts=3)
    def child(payload: int, ctx: TaskContext) -> int:
        if payload == 2:
            raise RuntimeError("a downstream outage")
        return payload

    @router.task("summarise")
    def summarise(payload: dict[str, Any], ctx: TaskContext) -> None:
        joined.append(payload)

    queue = StubQueue(max_attempts=3).bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", None, key="p")
    queue.drain(client)
    assert [j["summary"] for j in joined] == [{"total": 2, "completed": 1, "failed": 1}]
    queue.close()


def test_a_childs_large_result_reaches_then_or_is_refused(store: FanInStore) -> None:
    """A child's result over the record's 32 KiB is replaced by a note
    (``{"tasklease_result_dropped": ...}``) and the child still counts as ``completed``:
    ``then`` receives the note as that child's ``result``, with nothing in ``status`` or
    ``error`` saying the value was lost. The guide says ``result`` is "the child's return
    value"."""
    router = Router()
    joined: list[dict[str, Any]] = []
    big = "x" * (40 * 1024)

    @router.task("parent")
    def parent(payload: None, ctx: TaskContext) -> None:
        ctx.fan_out("child", [("a", 1)], then="summarise")

    @router.task("child")
    def child(payload: int, ctx: TaskContext) -> str:
        return big

    @router.task("summarise")
    def summarise(payload: dict[str, Any], ctx: TaskContext) -> None:
        joined.append(payload)

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", None, key="p")
    queue.drain(client)
    ((result,),) = [j["results"] for j in joined]
    # Completed (its effects happened), and the entry says its result could not be kept.
    assert result["status"] == "completed"
    assert result["result"] is None
    assert result["error"].startswith("result dropped: "), result
    queue.close()
