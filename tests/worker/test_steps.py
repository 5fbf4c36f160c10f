"""Durable steps and continuations through the real executor, on a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import flask
import pytest

from tasklease import protocol
from tasklease.errors import PermanentFailure
from tasklease.testing.contract_support import claim_request
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core import steps
from tasklease.worker.core.identity import Kind
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.base.store import Change, LeaseStore
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import CapturingProducer, FakeClock, task_headers


class CountingStore(SqliteStore):
    """A SQLite store counting its atomic changes (each one write at most) and plain reads."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writes = 0
        self.reads = 0

    def _read_modify_write(self, run_id: str, change: Change[Any]) -> Any:
        self.writes += 1
        return super()._read_modify_write(run_id, change)

    def get(self, run_id: str) -> Any:
        self.reads += 1
        return super().get(run_id)


def post(
    app: flask.Flask,
    task: str = "t-1",
    body: Any = None,
    *,
    retry: int = 0,
    headers: dict[str, str] | None = None,
) -> Any:
    return app.test_client().post(
        "/tasks/h",
        headers=task_headers(task=task, retry=retry) | (headers or {}),
        data=json.dumps(body or {}),
    )


def run_id_of(task: str = "t-1") -> str:
    from tasklease.worker.core.identity import DeliveryIdentity  # noqa: PLC0415

    return DeliveryIdentity(Kind.TASK, "h", queue="default", task_name=task).run_id


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    return CountingStore(tmp_path / "runs.db")


def app_with(
    store: SqliteStore, handler: Callable[..., Any], clock: FakeClock | None = None
) -> flask.Flask:
    router = Router()
    router.task("h")(handler)
    return create_app(router, store=store, auth="none", clock=clock or FakeClock())


def test_a_retry_resumes_after_the_last_completed_step(store: CountingStore) -> None:
    calls: list[str] = []
    failing = {"email": True}

    def handler(payload: Any, ctx: TaskContext) -> dict[str, Any]:
        def effect(name: str) -> str:
            calls.append(name)
            if failing.pop(name, False):
                raise RuntimeError(f"{name} is down")
            return f"{name}-done"

        return {name: ctx.step(name, effect, name) for name in ("charge", "order", "email")}

    app = app_with(store, handler)
    first = post(app)
    assert (first.status_code, first.headers[protocol.OUTCOME_HEADER]) == (500, "released")
    second = post(app, retry=1)
    assert second.headers[protocol.OUTCOME_HEADER] == "processed"
    assert calls == ["charge", "order", "email", "email"]
    assert second.json["result"] == {
        "charge": "charge-done",
        "order": "order-done",
        "email": "email-done",
    }
    record = store.get(run_id_of())
    assert record is not None
    assert [s.attempt_id for s in steps.steps_of(record).values()][:2] == [
        steps.steps_of(record)["charge"].attempt_id
    ] * 2


def test_a_completed_step_is_one_write_and_a_replayed_step_costs_nothing(
    store: CountingStore,
) -> None:
    crash = {"after": True}

    def handler(payload: Any, ctx: TaskContext) -> str:
        for i in range(5):
            ctx.step(f"item-{i}", lambda i=i: i * i)
        if crash.pop("after", False):
            raise RuntimeError("crash after the steps")
        return "ok"

    app = app_with(store, handler)
    post(app)
    # The claim, five steps, the release.
    assert (store.writes, store.reads) == (7, 0)
    store.writes = 0
    assert post(app).headers[protocol.OUTCOME_HEADER] == "processed"
    # The claim and the completion: the five steps came back with the claim's record.
    assert (store.writes, store.reads) == (2, 0)


def test_a_step_name_used_twice_fails_the_run_with_a_clear_error(store: CountingStore) -> None:
    def handler(payload: Any, ctx: TaskContext) -> None:
        ctx.step("send", lambda: 1)
        ctx.step("send", lambda: 2)

    reply = post(app_with(store, handler))
    assert reply.headers[protocol.OUTCOME_HEADER] == "failed"
    assert "used twice" in reply.json["message"]


def test_permanent_failure_in_a_step_fails_the_run(store: CountingStore) -> None:
    def handler(payload: Any, ctx: TaskContext) -> None:
        def refuse() -> None:
            raise PermanentFailure("card declined")

        ctx.step("charge", refuse)

    reply = post(app_with(store, handler))
    assert reply.headers[protocol.OUTCOME_HEADER] == "failed"
    record = store.get(run_id_of())
    assert record is not None and record.status is RunStatus.FAILED
    assert steps.steps_of(record) == {}


def test_a_stale_attempts_step_is_refused_and_raises_lease_lost(store: CountingStore) -> None:
    clock = FakeClock()

    def handler(payload: Any, ctx: TaskContext) -> None:
        ctx.step("first", lambda: 1)
        # Another attempt takes the run over (this one's lease has run out at the store).
        clock.advance(timedelta(hours=1))
        store.claim(claim_request(run_id_of(), "usurper", handler="h"), clock)
        ctx.step("second", lambda: 2)

    reply = post(app_with(store, handler, clock=clock))
    assert reply.headers[protocol.OUTCOME_HEADER] == "lost_claim"
    record = store.get(run_id_of())
    assert record is not None and record.attempt_id == "usurper"
    assert list(steps.steps_of(record)) == ["first"]


def test_step_keys_are_uuid_shaped_and_stable_per_run_and_step(store: CountingStore) -> None:
    keys: list[tuple[str, str]] = []

    def handler(payload: Any, ctx: TaskContext) -> None:
        keys.append((ctx.step_key("a"), ctx.step_key("b")))

    app = app_with(store, handler)
    post(app, task="t-1")
    post(app, task="t-2")
    (a1, b1), (a2, _) = keys
    assert str(uuid.UUID(a1)) == a1
    assert len({a1, b1, a2}) == 3
    assert steps.step_key(run_id_of("t-1"), "a") == a1


def test_the_decorator_form_runs_the_function_once_as_the_step(store: CountingStore) -> None:
    calls = []
    crash = {"once": True}

    def handler(payload: Any, ctx: TaskContext) -> Any:
        @ctx.step("charge")
        def charge() -> dict[str, int]:
            calls.append(1)
            return {"amount": 5}

        if crash.pop("once", False):
            raise RuntimeError("after the charge")
        return charge

    app = app_with(store, handler)
    post(app)
    assert post(app).json["result"] == {"amount": 5}
    assert calls == [1]


def test_async_handlers_await_their_steps(store: CountingStore) -> None:
    calls = []

    async def handler(payload: Any, ctx: TaskContext) -> Any:
        async def fetch() -> int:
            await asyncio.sleep(0)
            calls.append(1)
            return 41

        first = await ctx.astep("fetch", fetch)
        second = await ctx.astep("sync", lambda: first + 1)
        return [first, second]

    app = app_with(store, handler)
    assert post(app).json["result"] == [41, 42]
    record = store.get(run_id_of())
    assert record is not None and list(steps.steps_of(record)) == ["fetch", "sync"]


def test_a_continuation_chain_resumes_the_same_run_until_it_returns(
    store: CountingStore,
) -> None:
    seen: list[Any] = []

    def handler(payload: Any, ctx: TaskContext) -> Any:
        state = ctx.state or {"i": 0}
        seen.append((ctx.continuation, state["i"], ctx.run_id))
        ctx.step(f"chunk-{state['i']}", lambda: state["i"])
        if state["i"] < 3:
            ctx.continue_later({"i": state["i"] + 1}, delay=timedelta(seconds=5))
            return None
        return {"done": state["i"]}

    router = Router()
    router.task("h")(handler)
    producer = CapturingProducer()
    router.use_producer(producer)  # type: ignore[arg-type]
    app = create_app(router, store=store, auth="none", clock=FakeClock())
    run_id = run_id_of()
    first = post(app, body={"job": 1})
    assert first.headers[protocol.OUTCOME_HEADER] == "processed"
    assert post(app, retry=1).headers[protocol.OUTCOME_HEADER] == "duplicate"  # Lost reply.
    for seq in (1, 2, 3):
        header = {protocol.CONTINUATION_HEADER: f"{run_id}:{seq}"}
        ahead = {protocol.CONTINUATION_HEADER: f"{run_id}:{seq + 1}"}
        assert post(app, task=f"c-{seq + 1}", headers=ahead).status_code == 409
        reply = post(app, task=f"c-{seq}", headers=header)
        assert reply.headers[protocol.OUTCOME_HEADER] == "processed"
        assert (
            post(app, task=f"c-{seq}", retry=1, headers=header).headers[protocol.OUTCOME_HEADER]
            == "duplicate"
        )
    assert seen == [(0, 0, run_id), (1, 1, run_id), (2, 2, run_id), (3, 3, run_id)]
    assert sorted(producer.tasks) == [steps.continuation_key(run_id, n) for n in (1, 2, 3)]
    assert producer.tasks[steps.continuation_key(run_id, 1)]["payload"] == {"job": 1}
    record = store.get(run_id)
    assert record is not None and record.status is RunStatus.COMPLETED
    assert record.result == {"done": 3}
    assert record.identity["task_name"] == "t-1"
    assert list(steps.steps_of(record)) == ["chunk-3"]  # Each continuing delivery's dropped.


def test_a_continuation_header_naming_no_continued_run_is_rejected(store: CountingStore) -> None:
    app = app_with(store, lambda payload, ctx: None)
    reply = post(app, headers={protocol.CONTINUATION_HEADER: f"{'a' * 64}:1"})
    assert reply.status_code == 400
    assert store.get("a" * 64) is None


def _continue_then_fail_after_a_step(store: LeaseStore, name: str) -> None:
    """Delivery 0 records a step and continues; delivery 1 records step ``name`` and fails
    (released): the record holds delivery 1's step and continuation 1."""
    router = Router()

    @router.task("h")
    def handler(payload: Any, ctx: TaskContext) -> None:
        ctx.step(name, lambda: {"id": ctx.continuation})
        if ctx.continuation == 0:
            ctx.continue_later({"page": 2}, delay=3)
            return
        raise RuntimeError("after the step")

    router.use_producer(CapturingProducer())  # type: ignore[arg-type]
    app = create_app(router, store=store, auth="none")
    post(app)
    post(app, task="c-1", headers={protocol.CONTINUATION_HEADER: f"{run_id_of()}:1"})


def test_runs_show_lists_the_current_deliverys_steps_and_the_continuation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tasklease import cli  # noqa: PLC0415

    store = SqliteStore(tmp_path / "shown.db")
    _continue_then_fail_after_a_step(store, "charge")
    store.close()
    url = f"sqlite:///{tmp_path / 'shown.db'}"
    assert cli.main(["runs", "show", run_id_of(), "--store", url]) == 0
    text = capsys.readouterr().out
    assert "charge" in text and "8 bytes" in text
    assert "continuation       1" in text
    assert "steps of delivery  1" in text
    assert cli.main(["runs", "show", run_id_of(), "--store", url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in shown["steps"]] == ["charge"]  # Delivery 1's only.
    assert shown["continuation"]["seq"] == 1


def test_the_delivery_log_line_counts_steps_replayed_and_run(
    store: CountingStore, caplog: pytest.LogCaptureFixture
) -> None:
    crash = {"once": True}

    def handler(payload: Any, ctx: TaskContext) -> None:
        ctx.step("a", lambda: 1)
        if crash.pop("once", False):
            raise RuntimeError("after a")
        ctx.step("b", lambda: 2)

    app = app_with(store, handler)
    post(app)
    caplog.clear()
    with caplog.at_level("INFO", logger="tasklease"):
        post(app)
    from tasklease.worker.observe.logs import FIELDS_ATTRIBUTE  # noqa: PLC0415

    (line,) = [r for r in caplog.records if r.name == "tasklease.execution"]
    fields = getattr(line, FIELDS_ATTRIBUTE)
    assert (fields["steps_replayed"], fields["steps_run"]) == (1, 1)


def test_the_how_to_pages_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    page = (Path(__file__).parents[2] / "docs" / "how-to" / "durable-steps.md").read_text()
    example = page.split("```python\n", 1)[1].split("\n```", 1)[0]
    expected = example.rsplit("# ", 1)[1].strip()
    script = tmp_path / "durable_steps.py"
    script.write_text(example)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == expected


def test_the_dashboard_run_page_lists_the_steps_and_the_continuation(tmp_path: Path) -> None:
    from tasklease.worker.dashboard import create_dashboard_app  # noqa: PLC0415

    store = SqliteStore(tmp_path / "dash.db")
    _continue_then_fail_after_a_step(store, "<charge>")
    page = create_dashboard_app(store).test_client().get(f"/runs/{run_id_of()}")
    assert page.status_code == 200
    assert '<table id="steps">' in page.text
    assert "&lt;charge&gt;" in page.text and "8 bytes" in page.text  # Names are escaped.
    assert "Continuation 1 recorded" in page.text and "delay 3.0 s" in page.text
    assert "Steps of delivery 1" in page.text


def test_a_continuation_state_is_not_counted_with_the_steps_its_write_drops(
    store: CountingStore,
) -> None:
    half = "x" * (steps.MAX_STEP_RESULT_BYTES - 20)

    def handler(payload: Any, ctx: TaskContext) -> None:
        ctx.step("one", lambda: half)
        ctx.continue_later({"more": half})

    router = Router()
    router.task("h")(handler)
    router.use_producer(CapturingProducer())  # type: ignore[arg-type]
    reply = post(create_app(router, store=store, auth="none"))
    assert reply.headers[protocol.OUTCOME_HEADER] == "processed"
    record = store.get(run_id_of())
    assert record is not None and steps.steps_of(record) == {}


def test_a_continuation_state_past_the_per_step_cap_fails_the_run_with_a_clear_error(
    store: CountingStore,
) -> None:
    def handler(payload: Any, ctx: TaskContext) -> None:
        ctx.continue_later({"more": "x" * steps.MAX_STEP_RESULT_BYTES})

    reply = post(app_with(store, handler))
    assert reply.headers[protocol.OUTCOME_HEADER] == "failed"
    assert "continue_later state" in reply.json["message"]


def test_a_continuation_of_another_callers_run_is_refused_revealing_nothing_of_it() -> None:
    from tasklease.testing.contract_support import T0  # noqa: PLC0415
    from tasklease.worker.core import decisions  # noqa: PLC0415
    from tasklease.worker.core.identity import DeliveryIdentity  # noqa: PLC0415
    from tasklease.worker.core.records import Verdict  # noqa: PLC0415
    from tasklease.worker.delivery import continuation  # noqa: PLC0415

    router = Router()
    router.task("h")(lambda payload, ctx: None)
    spec = router.handler(Kind.TASK, "h")
    assert spec is not None
    owned = decisions.claim(None, claim_request("r", handler="h", caller="a@x"), T0).record
    owned = decisions.continued(owned, '{"seq":3,"state":null}', T0)
    forged = DeliveryIdentity(Kind.TASK, "h", continues="r", continuation_seq=1)
    # Not "superseded by delivery 3": that would tell another caller the run exists.
    assert continuation.refusal(owned, forged, spec, "b@x", T0) is None
    assert decisions.decide(owned, T0, "b@x") is Verdict.FORBIDDEN
    stale = continuation.refusal(owned, forged, spec, "a@x", T0)
    assert stale is not None and stale.outcome.value == "duplicate"
