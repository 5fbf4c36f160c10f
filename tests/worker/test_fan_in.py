"""Fan-in through the worker: ``ctx.fan_out(..., then=...)`` and ``producer.fan_out(..., then=)``
under duplicates, lost answers, failed children, retried parents and a failed then enqueue."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasklease import protocol
from tasklease.errors import PermanentFailure, StoreUnavailable
from tasklease.producer import InvalidTask
from tasklease.testing.stubs import StubQueue
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core import fan_in
from tasklease.worker.core.records import RunStatus
from tasklease.worker.delivery.fan_in import then_payload
from tasklease.worker.stores import FirestoreStore, MemoryStore, SqliteStore
from tasklease.worker.stores.base.fan_ins import FanInStore
from tests.support.firestore import PROJECT, unique_collection
from tests.support.helpers import T0


@pytest.fixture(params=["memory", "sqlite", "firestore"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FanInStore]:
    made: FanInStore
    if request.param == "memory":
        made = MemoryStore()
    elif request.param == "sqlite":
        made = SqliteStore(tmp_path / "r.db")
    else:
        request.getfixturevalue("firestore_host")  # Google's emulator, started for the session.
        made = FirestoreStore.from_options(collection=unique_collection(), project=PROJECT)
    yield made
    made.close()


class Flow:
    """A parent that fans out ``count`` children and a then handler that records its calls."""

    def __init__(self, count: int, *, fail: set[int] | None = None) -> None:
        self.router = Router()
        self.child_runs: Counter[int] = Counter()
        self.then_payloads: list[dict[str, Any]] = []
        self.parent_attempts = 0
        self.count = count
        failing = fail or set()

        @self.router.task("parent")
        def parent(payload: dict[str, Any], ctx: TaskContext) -> str:
            self.parent_attempts += 1
            items = [(f"item-{n:04d}", {"n": n}) for n in range(payload["count"])]
            ctx.fan_out("child", items, then="summarise")
            if payload.get("crash_once") and self.parent_attempts == 1:
                raise RuntimeError("the parent dies after its fan-out")
            return "fanned out"

        @self.router.task("child")
        def child(payload: dict[str, int], ctx: TaskContext) -> int:
            self.child_runs[payload["n"]] += 1
            if payload["n"] in failing:
                raise PermanentFailure(f"child {payload['n']} cannot be done")
            return payload["n"] * 10

        @self.router.task("summarise")
        def summarise(payload: dict[str, Any], ctx: TaskContext) -> int:
            self.then_payloads.append(payload)
            return len(payload["results"])


def test_a_join_under_duplicates_and_lost_answers_runs_then_once_with_every_result(
    store: FanInStore,
) -> None:
    flow = Flow(30)
    queue = StubQueue().bind(flow.router)
    client = create_app(flow.router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", {"count": 30}, key="p")
    queue.drain(client, duplicate_every=3, lose_response_every=4)
    assert all(runs == 1 for runs in flow.child_runs.values())
    assert len(flow.child_runs) == 30
    (payload,) = flow.then_payloads
    assert payload["summary"] == {"total": 30, "completed": 30, "failed": 0}
    assert [r["key"] for r in payload["results"]] == [f"item-{n:04d}" for n in range(30)]
    assert [r["result"] for r in payload["results"]] == [n * 10 for n in range(30)]
    assert payload["next_after"] is None
    join = store.get_fan_in(payload["join_id"])
    assert join is not None
    assert join.then_enqueued_at is not None
    assert store.fan_ins_of(payload["parent_run_id"]) == [join]
    queue.close()


def test_a_child_failed_for_good_is_listed_with_its_error(store: FanInStore) -> None:
    flow = Flow(4, fail={2})
    queue = StubQueue().bind(flow.router)
    client = create_app(flow.router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", {"count": 4}, key="p")
    queue.drain(client)
    (payload,) = flow.then_payloads
    assert payload["summary"] == {"total": 4, "completed": 3, "failed": 1}
    failed = [r for r in payload["results"] if r["status"] == "failed"]
    assert failed == [
        {
            "key": "item-0002",
            "status": "failed",
            "result": None,
            "error": "PermanentFailure: child 2 cannot be done",
        }
    ]
    queue.close()


def test_a_parent_retried_after_its_fan_out_creates_no_second_set(store: FanInStore) -> None:
    flow = Flow(5)
    queue = StubQueue().bind(flow.router)
    client = create_app(flow.router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", {"count": 5, "crash_once": True}, key="p")
    queue.drain(client)
    assert flow.parent_attempts == 2
    assert sum(task.handler == "child" for task in queue.tasks) == 5
    assert all(runs == 1 for runs in flow.child_runs.values())
    assert len(flow.then_payloads) == 1
    queue.close()


def test_a_then_enqueue_that_fails_is_retried_through_the_childs_redelivery(
    store: FanInStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = Flow(3)
    queue = StubQueue().bind(flow.router)
    client = create_app(flow.router, store=store, auth="none").test_client()
    enqueue = queue.producer.enqueue
    failures = [RuntimeError("Cloud Tasks is unavailable")]

    def flaky(task_name: str, *args: Any, **kwargs: Any) -> Any:
        if task_name == "summarise" and failures:
            raise failures.pop()
        return enqueue(task_name, *args, **kwargs)

    monkeypatch.setattr(queue.producer, "enqueue", flaky)
    queue.producer.enqueue("parent", {"count": 3}, key="p")
    summary = queue.drain(client)
    assert summary.outcomes["unavailable"] == 1  # The closing child, answered 503 once.
    assert all(runs == 1 for runs in flow.child_runs.values())
    assert len(flow.then_payloads) == 1
    queue.close()


def test_an_empty_fan_out_runs_then_at_once_with_no_results(store: FanInStore) -> None:
    flow = Flow(0)
    queue = StubQueue().bind(flow.router)
    client = create_app(flow.router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", {"count": 0}, key="p")
    queue.drain(client, duplicate_every=1)
    (payload,) = flow.then_payloads
    assert payload["results"] == []
    assert payload["summary"]["total"] == 0
    queue.close()


def test_past_a_thousand_children_the_payload_holds_a_page_and_ctx_pages_the_rest() -> None:
    store = MemoryStore()
    router = Router()
    pages: list[tuple[int, str | None, int]] = []

    @router.task("parent")
    def parent(payload: None, ctx: TaskContext) -> None:
        ctx.fan_out("child", [(f"k{n:05d}", n) for n in range(1003)], then="summarise")

    @router.task("child")
    def child(payload: int, ctx: TaskContext) -> int:
        return payload

    @router.task("summarise")
    def summarise(payload: dict[str, Any], ctx: TaskContext) -> None:
        rest = ctx.fan_in_results(after=payload["next_after"])
        pages.append((len(payload["results"]), payload["next_after"], len(rest)))

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", None, key="p")
    queue.drain(client, limit=5000)
    assert pages == [(1000, "k00999", 3)]
    queue.close()


def test_a_then_payload_too_large_for_one_task_holds_a_smaller_page() -> None:
    join = fan_in.FanInRecord("a" * 32, "p", "then", 40, T0, T0, completed=40)
    entries = [
        fan_in.ChildEntry(
            "a" * 32, f"k{n:02d}", f"r{n}", RunStatus.COMPLETED, T0, '"' + "x" * 100 + '"'
        )
        for n in range(40)
    ]
    payload = then_payload(join, entries, room=2000)
    assert 0 < len(payload["results"]) < 40
    assert payload["next_after"] == payload["results"][-1]["key"]


def test_fan_out_refuses_repeated_keys_and_an_unknown_then() -> None:
    flow = Flow(0)
    queue = StubQueue().bind(flow.router)

    class Ctx:
        run_id = "run-1"

    with pytest.raises(InvalidTask, match="appears twice"):
        queue.producer.fan_out(Ctx(), "child", [("a", 1), ("a", 2)], then="summarise")
    with pytest.raises(InvalidTask, match="no task handler"):
        queue.producer.fan_out(Ctx(), "child", [("a", 1)], then="sumarise")
    assert queue.tasks == []
    queue.close()


def test_a_malformed_fan_in_header_is_refused_before_any_claim(store: FanInStore) -> None:
    flow = Flow(1)
    client = create_app(flow.router, store=store, auth="none").test_client()
    from tests.support.helpers import task_headers  # noqa: PLC0415

    headers = {**task_headers("t-1"), protocol.FAN_IN_HEADER: "v1;nope"}
    reply = client.post("/tasks/child", headers=headers, json={"n": 1})
    assert reply.status_code == 400
    assert "fan-in" in reply.get_data(as_text=True)
    assert store.list_runs() == []


class _LosesOneAnswer(MemoryStore):
    """A store whose first member finish lands and then answers as if the store had failed."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    def _read_modify_write_member(
        self, run_id: str, member: Any, change: Any, now: Any, keep_for: Any
    ) -> Any:
        value = super()._read_modify_write_member(run_id, member, change, now, keep_for)
        if not self.lost:
            self.lost += 1
            raise StoreUnavailable("the answer was lost on the way back")
        return value


def test_a_child_whose_finish_landed_unheard_is_counted_once() -> None:
    store = _LosesOneAnswer()
    flow = Flow(3)
    queue = StubQueue().bind(flow.router)
    client = create_app(flow.router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", {"count": 3}, key="p")
    queue.drain(client)
    assert store.lost == 1
    assert all(runs == 1 for runs in flow.child_runs.values())
    (payload,) = flow.then_payloads
    assert payload["summary"] == {"total": 3, "completed": 3, "failed": 0}
    queue.close()


def test_a_transactional_child_is_counted_after_its_commit(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "t.db")
    router = Router()
    seen: list[dict[str, Any]] = []

    @router.task("parent")
    def parent(payload: None, ctx: TaskContext) -> None:
        ctx.fan_out("child", [(f"k{n}", n) for n in range(4)], then="summarise")

    @router.task("child", transactional=True)
    def child(payload: int, ctx: TaskContext) -> int:
        ctx.transaction.execute("CREATE TABLE IF NOT EXISTS done (n INTEGER PRIMARY KEY)")
        ctx.transaction.execute("INSERT INTO done VALUES (?)", (payload,))
        return payload

    @router.task("summarise")
    def summarise(payload: dict[str, Any], ctx: TaskContext) -> None:
        seen.append(payload)

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", None, key="p")
    queue.drain(client, duplicate_every=2, lose_response_every=3)
    (payload,) = seen
    assert [r["result"] for r in payload["results"]] == [0, 1, 2, 3]
    queue.close()
    store.close()


def test_the_how_to_pages_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    page = (Path(__file__).parents[2] / "docs" / "how-to" / "fan-in.md").read_text()
    example = page.split("```python\n", 1)[1].split("\n```", 1)[0]
    expected = example.rsplit("# ", 1)[1].strip()
    script = tmp_path / "fan_in.py"
    script.write_text(example)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == expected


def _fanned_out_on_sqlite(path: Path) -> str:
    """A parent fanned out and its four children finished on the SQLite file at ``path``;
    returns the parent's run id."""
    store = SqliteStore(path)
    flow = Flow(4, fail={3})
    queue = StubQueue().bind(flow.router)
    client = create_app(flow.router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", {"count": 4}, key="p")
    queue.drain(client)
    (payload,) = flow.then_payloads
    queue.close()
    store.close()
    return str(payload["parent_run_id"])


def test_runs_show_lists_a_parents_fan_in_and_its_children(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tasklease import cli  # noqa: PLC0415

    parent = _fanned_out_on_sqlite(tmp_path / "shown.db")
    url = f"sqlite:///{tmp_path / 'shown.db'}"
    assert cli.main(["runs", "show", parent, "--store", url]) == 0
    text = capsys.readouterr().out
    assert "-> summarise: 4/4 finished (1 failed), then enqueued at" in text
    assert "item-0003  failed" in text
    assert cli.main(["runs", "show", parent, "--store", url, "--json"]) == 0
    (join,) = json.loads(capsys.readouterr().out)["fan_ins"]
    assert (join["expected"], join["completed"], join["failed"], join["pending"]) == (4, 3, 1, 0)
    assert [c["key"] for c in join["children"]] == [f"item-{n:04d}" for n in range(4)]


def test_the_dashboard_run_page_shows_the_fan_in_and_links_its_children(tmp_path: Path) -> None:
    from tasklease.worker.dashboard import create_dashboard_app  # noqa: PLC0415

    parent = _fanned_out_on_sqlite(tmp_path / "dash.db")
    store = SqliteStore(tmp_path / "dash.db")
    page = create_dashboard_app(store).test_client().get(f"/runs/{parent}")
    assert page.status_code == 200
    assert "Fan-in to summarise" in page.text
    assert "4 of 4 children finished (1 failed, 0 pending)" in page.text
    child = store.fan_in_entries(store.fan_ins_of(parent)[0].join_id)[0]
    assert f"/runs/{child.run_id}" in page.text
    store.close()


def test_an_async_handler_fans_out_with_afan_out_and_the_async_producer_joins_too(
    store: FanInStore,
) -> None:
    import asyncio  # noqa: PLC0415

    router = Router()
    joined: list[dict[str, Any]] = []

    @router.task("parent")
    async def parent(payload: None, ctx: TaskContext) -> None:
        await ctx.afan_out("child", [("a", 1), ("b", 2)], then="summarise")

    @router.task("child")
    async def child(payload: int, ctx: TaskContext) -> int:
        return payload + 100

    @router.task("summarise")
    def summarise(payload: dict[str, Any], ctx: TaskContext) -> None:
        joined.append(payload)

    queue = StubQueue().bind(router)
    client = create_app(router, store=store, auth="none").test_client()
    queue.producer.enqueue("parent", None, key="p")
    queue.drain(client, duplicate_every=2)

    class Ctx:
        run_id = "outside-1"

    created = asyncio.run(
        queue.async_producer.fan_out(Ctx(), "child", [("c", 3)], then="summarise")
    )
    assert [r.created for r in created] == [True]
    queue.drain(client)
    assert [[r["result"] for r in j["results"]] for j in joined] == [[101, 102], [103]]
    assert joined[1]["parent_run_id"] == "outside-1"
    queue.close()
