"""``async def`` handlers behave as sync ones: every outcome, renewal and fencing, through
Flask's test client, and under a real gunicorn process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Unpack

import flask
import pytest
import requests

from tasklease.errors import LeaseLost, PermanentFailure
from tasklease.plumbing.serve import GunicornWorker
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.runtime.event_loop import HANDLER_LOOP, LoopNotStarted
from tasklease.worker.stores import MemoryStore
from tests.support.helpers import (
    FakeClock,
    SwitchableStore,
    TaskHeaderFields,
    claim_request,
    job_headers,
    task_headers,
)

LOOP_THREAD = "tasklease-handler-loop"


class ThreadRecordingStore(SwitchableStore):
    """Records the thread of every store call that reads or writes a record."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.threads: list[str] = []
        self.renewals = 0

    def _check(self) -> None:
        self.threads.append(threading.current_thread().name)
        super()._check()

    def renew_run(self, *args: Any, **kwargs: Any) -> Any:
        self.renewals += 1
        return super().renew_run(*args, **kwargs)


def post(app: flask.Flask, path: str = "/tasks/h", **fields: Unpack[TaskHeaderFields]) -> Any:
    return app.test_client().post(
        path, headers=task_headers(**fields), data=json.dumps({"order_id": 42})
    )


def app_for(router: Router, store: Any, clock: Any = None) -> flask.Flask:
    if clock is None:
        return create_app(router, store=store, auth="none")
    return create_app(router, store=store, auth="none", clock=clock)


def test_an_async_handler_runs_on_the_loop_and_no_store_call_does() -> None:
    router, store = Router(), ThreadRecordingStore()
    seen: list[str] = []

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> dict[str, Any]:
        await asyncio.sleep(0)
        seen.append(threading.current_thread().name)
        return {"receipt_for": payload["order_id"], "attempt": ctx.attempt}

    app = app_for(router, store)
    first = post(app)
    again = post(app, retry=1, execution=1)
    assert (first.status_code, first.headers["X-Tasklease-Outcome"]) == (200, "processed")
    assert first.json["result"] == {"receipt_for": 42, "attempt": 1}
    assert (again.headers["X-Tasklease-Outcome"], again.json["result"]) == (
        "duplicate",
        {"receipt_for": 42, "attempt": 1},
    )
    assert seen == [LOOP_THREAD]
    assert store.threads and LOOP_THREAD not in store.threads


def test_an_async_scheduled_handler_runs_once_per_slot() -> None:
    router, store = Router(), MemoryStore()
    runs: list[str] = []

    @router.scheduled("nightly")
    async def nightly(ctx: TaskContext) -> str:
        runs.append(ctx.run_id)
        return "reports sent"

    app = app_for(router, store)
    client = app.test_client()
    first = client.post("/jobs/nightly", headers=job_headers())
    again = client.post("/jobs/nightly", headers=job_headers())
    assert (first.headers["X-Tasklease-Outcome"], first.get_json()["result"]) == (
        "processed",
        "reports sent",
    )
    assert again.headers["X-Tasklease-Outcome"] == "duplicate"
    assert len(runs) == 1


def test_a_permanent_failure_from_an_async_handler_is_a_dead_letter() -> None:
    router, store = Router(), MemoryStore()

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> None:
        await asyncio.sleep(0)
        raise PermanentFailure("order 42 does not exist")

    response = post(app_for(router, store))
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (200, "failed")
    record = store.get(response.headers["X-Tasklease-Run-Id"])
    assert record is not None and record.status is RunStatus.FAILED
    assert record.error == "PermanentFailure: order 42 does not exist"


def test_an_exception_from_an_async_handler_releases_the_run_for_a_retry() -> None:
    router, store = Router(), MemoryStore()

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> str:
        await asyncio.sleep(0)
        if ctx.attempt == 1:
            raise ConnectionError("mail server down")
        return "sent"

    app = app_for(router, store)
    first = post(app)
    assert (first.status_code, first.headers["X-Tasklease-Outcome"]) == (500, "released")
    record = store.get(first.headers["X-Tasklease-Run-Id"])
    assert record is not None and record.error == "ConnectionError: mail server down"
    second = post(app, retry=1, execution=1)
    assert (second.status_code, second.headers["X-Tasklease-Outcome"]) == (200, "processed")


def test_a_cancelled_async_handler_is_released_not_a_crash() -> None:
    router, store = Router(), MemoryStore()

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> None:
        raise asyncio.CancelledError

    response = post(app_for(router, store))
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (500, "released")
    assert "HandlerCancelled" in response.json["message"]


def test_an_async_handler_that_checks_its_lease_after_a_takeover_stops_with_409() -> None:
    router, store, clock = Router(), SwitchableStore(MemoryStore()), FakeClock()
    side_effects: list[str] = []

    @router.task("h", lease=timedelta(minutes=1))
    async def h(payload: Any, ctx: TaskContext) -> None:
        store.claim(claim_request(ctx.run_id, "newer-attempt"), clock() + timedelta(minutes=2))
        ctx._live.mark_lease_lost()  # What the lease keeper does when it finds the takeover.
        await asyncio.sleep(0)
        ctx.check_lease()
        side_effects.append("should not happen")

    response = post(app_for(router, store, clock))
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (409, "lost_claim")
    assert side_effects == []
    record = store.get(response.headers["X-Tasklease-Run-Id"])
    assert record is not None and record.attempt_id == "newer-attempt"


def test_an_async_handlers_outcome_after_a_takeover_is_not_recorded() -> None:
    router, store, clock = Router(), SwitchableStore(MemoryStore()), FakeClock()

    @router.task("h", lease=timedelta(minutes=1))
    async def h(payload: Any, ctx: TaskContext) -> str:
        clock.advance(timedelta(minutes=2))  # Past the lease, with no renewal yet.
        store.claim(claim_request(ctx.run_id, "newer-attempt"), clock())
        return "late"

    response = post(app_for(router, store, clock))
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (409, "lost_claim")
    record = store.get(response.headers["X-Tasklease-Run-Id"])
    assert record is not None
    assert (record.attempt_id, record.status) == ("newer-attempt", RunStatus.IN_PROGRESS)


def test_an_async_handlers_lease_is_renewed_while_it_awaits() -> None:
    router, store = Router(), ThreadRecordingStore()

    @router.task("h", lease=timedelta(seconds=1))
    async def h(payload: Any, ctx: TaskContext) -> int:
        deadline = time.monotonic() + 20
        while store.renewals < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        ctx.check_lease()
        return store.renewals

    response = post(app_for(router, store))
    assert response.headers["X-Tasklease-Outcome"] == "processed"
    assert response.json["result"] >= 2
    assert LOOP_THREAD not in store.threads


def test_an_async_handler_cut_off_from_its_store_fences_itself() -> None:
    router, store = Router(), SwitchableStore(MemoryStore())

    @router.task("h", lease=timedelta(seconds=1))
    async def h(payload: Any, ctx: TaskContext) -> None:
        deadline = time.monotonic() + 20
        while not ctx.lease_lost and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # Every renewal fails meanwhile.
        store.down = False
        ctx.check_lease()

    store.down_after_claim = True
    response = post(app_for(router, store))
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (409, "lost_claim")


def test_a_result_an_async_handler_returns_that_json_cannot_encode_is_a_failure() -> None:
    router, store = Router(), MemoryStore()

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> object:
        return object()

    response = post(app_for(router, store))
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (200, "failed")
    assert "JSON" in response.json["message"]


def test_a_plain_function_returning_a_coroutine_is_awaited() -> None:
    router, store = Router(), MemoryStore()

    async def send(order_id: int) -> dict[str, int]:
        await asyncio.sleep(0)
        return {"sent": order_id}

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> Coroutine[Any, Any, dict[str, int]]:
        return send(payload["order_id"])

    response = post(app_for(router, store))
    assert (response.headers["X-Tasklease-Outcome"], response.json["result"]) == (
        "processed",
        {"sent": 42},
    )


def test_concurrent_async_handlers_share_one_loop() -> None:
    """One handler awaits an event the other sets: they can only meet on one running loop."""
    router, store = Router(), MemoryStore()
    met = asyncio.Event()

    @router.task("waiter")
    async def waiter(payload: Any, ctx: TaskContext) -> str:
        await asyncio.wait_for(met.wait(), timeout=20)
        return "met"

    @router.task("setter")
    async def setter(payload: Any, ctx: TaskContext) -> str:
        met.set()
        return "set"

    app = app_for(router, store)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(post, app, "/tasks/waiter", task="w")
        setting = post(app, "/tasks/setter", task="s")
        assert waiting.result(timeout=30).json["result"] == "met"
    assert setting.json["result"] == "set"
    assert HANDLER_LOOP.thread is not None and HANDLER_LOOP.thread.name == LOOP_THREAD


def test_an_async_task_with_a_concurrency_key_runs_and_frees_its_key() -> None:
    router, store = Router(), MemoryStore()

    @router.task("h", concurrency_key=lambda payload: payload["order_id"])
    async def h(payload: Any, ctx: TaskContext) -> str | None:
        return ctx.lock

    app = app_for(router, store)
    first, second = post(app, task="a"), post(app, task="b")
    assert [r.headers["X-Tasklease-Outcome"] for r in (first, second)] == ["processed"] * 2
    assert first.json["result"] is not None


def test_lease_lost_raised_by_an_async_handler_is_lost_claim() -> None:
    router, store = Router(), MemoryStore()

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> None:
        raise LeaseLost("the handler decided its lease is gone")

    response = post(app_for(router, store))
    assert (response.status_code, response.headers["X-Tasklease-Outcome"]) == (409, "lost_claim")


def test_a_loop_that_cannot_start_gives_the_claim_back_uncounted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    router, store = Router(), MemoryStore()
    ran: list[int] = []

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> None:
        ran.append(ctx.attempt)

    def cannot_start() -> Any:
        raise LoopNotStarted("the handler event loop could not start: no threads left")

    app = app_for(router, store)
    monkeypatch.setattr(HANDLER_LOOP, "_started", cannot_start)
    refused = post(app)
    monkeypatch.undo()
    retried = post(app, retry=1)
    assert (refused.status_code, refused.headers["X-Tasklease-Outcome"]) == (503, "unavailable")
    assert retried.headers["X-Tasklease-Outcome"] == "processed"
    assert ran == [1]  # The refused delivery's attempt was not counted.


def test_a_forked_child_runs_handlers_on_a_loop_of_its_own() -> None:
    """gunicorn forks workers from a master that may have used the loop (--preload)."""

    async def pid() -> int:
        return os.getpid()

    assert HANDLER_LOOP.run(pid()) == os.getpid()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports by its exit code only.
        signal.alarm(20)  # Never hang the suite on a child that lost its loop.
        ok = HANDLER_LOOP.run(pid()) == os.getpid() and HANDLER_LOOP.thread is not None
        os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_async_handlers_under_gunicorn_run_each_task_once(tmp_path: Path) -> None:
    server = GunicornWorker(
        "tests.support.async_apps:router",
        store=f"sqlite:///{tmp_path}/runs.db",
        workers=2,
        env={"TEST_DIR": str(tmp_path)},
        log_path=tmp_path / "gunicorn.log",
    )

    def deliver(path: str, attempt: int = 0, task: str = "task-1") -> requests.Response:
        return requests.post(
            f"{server.url}{path}",
            json={"order_id": 7},
            headers=task_headers(retry=attempt, task=task),
            timeout=30,
        )

    with server, ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(lambda n: deliver("/tasks/slow_async", n), range(12)))
        late = deliver("/tasks/slow_async")
        refused = deliver("/tasks/refuse_async")
        flaky = [deliver("/tasks/flaky_async", n) for n in range(2)]
        job = requests.post(f"{server.url}/jobs/async_job", headers=job_headers(), timeout=30)
    outcomes = Counter(r.headers["X-Tasklease-Outcome"] for r in responses)
    assert outcomes["processed"] == 1
    assert outcomes["processed"] + outcomes["in_progress"] + outcomes["duplicate"] == 12
    assert late.headers["X-Tasklease-Outcome"] == "duplicate"
    executions = (tmp_path / "executions.log").read_text().splitlines()
    assert len(executions) == 1 and executions[0].endswith(LOOP_THREAD)
    assert (refused.status_code, refused.headers["X-Tasklease-Outcome"]) == (200, "failed")
    assert [r.headers["X-Tasklease-Outcome"] for r in flaky] == ["released", "processed"]
    assert (job.headers["X-Tasklease-Outcome"], job.json()["result"]) == ("processed", "ran")
