"""An ``async def`` handler on a store that never waits runs its whole delivery on the ASGI
server's event loop: claim, handler, finish, answer, with no delivery thread.

Every outcome is the threaded path's (same status, outcome, message and log line); the lease
is renewed while the handler awaits and ``ctx.check_lease()`` fences it after a takeover; a
sync handler never runs on the loop, and a store that may block is never called there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from tasklease.errors import LeaseLost, PermanentFailure
from tasklease.plumbing.serve import GunicornWorker
from tasklease.worker import Router, TaskContext
from tasklease.worker.asgi import AsgiDeliveries, create_asgi_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.observe.logs import FIELDS_ATTRIBUTE
from tasklease.worker.serving.asgi_routes import Message
from tasklease.worker.stores import MemoryStore
from tasklease.worker.stores.base.store import LeaseStore
from tests.support.helpers import FakeClock, SwitchableStore, claim_request, task_headers

Answer = tuple[int, dict[str, str], dict[str, Any]]


class WatchedMemory(MemoryStore):
    """MemoryStore (never waits) that records the thread of every claim, read and renewal."""

    nonblocking = True

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []
        self.renewals = 0

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.get_ident())
        return super().claim(*args, **kwargs)

    def get(self, run_id: str) -> Any:
        self.threads.append(threading.get_ident())
        return super().get(run_id)

    def renew(self, *args: Any, **kwargs: Any) -> Any:
        self.renewals += 1
        return super().renew(*args, **kwargs)


class BlockingMemory(WatchedMemory):
    """The same store, declared as one that may block: it must be called off the loop."""

    nonblocking = False


class NonblockingSwitchable(SwitchableStore):
    nonblocking = True


class Loop:
    """An ASGI app driven in process on an event loop of this thread, counting hops."""

    def __init__(self, router: Router, store: LeaseStore, clock: Any = None) -> None:
        options: dict[str, Any] = {} if clock is None else {"clock": clock}
        self.app: AsgiDeliveries = create_asgi_app(router, store=store, auth="none", **options)
        self.hops = 0
        in_thread = self.app._in_thread

        async def counted(function: Any) -> Any:
            self.hops += 1
            return await in_thread(function)

        self.app._in_thread = counted  # type: ignore[method-assign]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.get_ident()  # run_until_complete runs it on this thread.

    def post(self, name: str = "h", body: bytes = b'{"n": 1}', **headers: Any) -> Answer:
        sent_headers = task_headers(**headers)
        scope = {
            "type": "http",
            "method": "POST",
            "path": f"/tasks/{name}",
            "root_path": "",
            "query_string": b"",
            "headers": [(k.lower().encode(), v.encode()) for k, v in sent_headers.items()]
            + [(b"content-length", str(len(body)).encode())],
        }
        sent: list[Message] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: Message) -> None:
            sent.append(message)

        self.loop.run_until_complete(self.app(scope, receive, send))
        start, body_message = sent
        answer_headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
        return start["status"], answer_headers, json.loads(body_message["body"])

    def close(self) -> None:
        if self.app._pool is not None:
            self.app._pool.close()
        self.loop.close()


@pytest.fixture(autouse=True)
def _no_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another test in this process may have loaded OpenTelemetry, which keeps every delivery
    # in a thread; these tests are about the loop path.
    monkeypatch.setattr("tasklease.worker.observe.telemetry.opentelemetry_in_use", lambda: False)


@pytest.fixture
def loops() -> Iterator[list[Loop]]:
    made: list[Loop] = []
    yield made
    for loop in made:
        loop.close()


def outcome(answer: Answer) -> tuple[int, str]:
    return answer[0], answer[1]["x-tasklease-outcome"]


def outcome_router(ran_on: list[int]) -> Router:
    """One ``async def`` handler per outcome, each recording the thread it ran on."""
    router = Router()

    @router.task("done")
    async def done(payload: Any, ctx: TaskContext) -> dict[str, Any]:
        ran_on.append(threading.get_ident())
        await asyncio.sleep(0)
        return {"n": payload["n"]}

    @router.task("raises")
    async def raises(payload: Any, ctx: TaskContext) -> None:
        ran_on.append(threading.get_ident())
        await asyncio.sleep(0)
        raise RuntimeError("try again")

    @router.task("refuses")
    async def refuses(payload: Any, ctx: TaskContext) -> None:
        ran_on.append(threading.get_ident())
        raise PermanentFailure("no such order")

    @router.task("cancels")
    async def cancels(payload: Any, ctx: TaskContext) -> None:
        ran_on.append(threading.get_ident())
        raise asyncio.CancelledError

    @router.task("times_out")
    async def times_out(payload: Any, ctx: TaskContext) -> None:
        ran_on.append(threading.get_ident())
        async with asyncio.timeout(0.01):
            await asyncio.sleep(10)

    @router.task("loses")
    async def loses(payload: Any, ctx: TaskContext) -> None:
        ran_on.append(threading.get_ident())
        raise LeaseLost("gone")

    @router.task("unencodable")
    async def unencodable(payload: Any, ctx: TaskContext) -> object:
        ran_on.append(threading.get_ident())
        return object()

    @router.task("gives_up", max_attempts=1)
    async def gives_up(payload: Any, ctx: TaskContext) -> None:
        ran_on.append(threading.get_ident())
        raise RuntimeError("once only")

    return router


OUTCOMES = {
    "done": (200, "processed"),
    "raises": (500, "released"),
    "refuses": (200, "failed"),
    "cancels": (500, "released"),
    "times_out": (500, "released"),
    "loses": (409, "lost_claim"),
    "unencodable": (200, "failed"),
}


def execution_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, dict[str, Any]]]:
    varying = ("duration_ms", "attempt_id", "error")
    return [
        (
            record.getMessage(),
            {k: v for k, v in getattr(record, FIELDS_ATTRIBUTE, {}).items() if k not in varying},
        )
        for record in caplog.records
        if record.name == "tasklease.execution"
    ]


@pytest.mark.parametrize("name", sorted(OUTCOMES))
def test_every_outcome_on_the_loop_is_the_threaded_paths_answer_and_log_line(
    name: str, loops: list[Loop], caplog: pytest.LogCaptureFixture
) -> None:
    on_loop_threads: list[int] = []
    in_thread_threads: list[int] = []
    on_loop = Loop(outcome_router(on_loop_threads), WatchedMemory())
    threaded = Loop(outcome_router(in_thread_threads), BlockingMemory())
    loops.extend([on_loop, threaded])
    caplog.set_level(logging.INFO, logger="tasklease.execution")

    loop_answer = on_loop.post(name, task="t-1")
    loop_lines = execution_lines(caplog)
    caplog.clear()
    thread_answer = threaded.post(name, task="t-1")
    thread_lines = execution_lines(caplog)

    assert outcome(loop_answer) == OUTCOMES[name]
    assert outcome(thread_answer) == OUTCOMES[name]
    varying = ("x-tasklease-run-id",)
    assert {k: v for k, v in loop_answer[1].items() if k not in varying} == {
        k: v for k, v in thread_answer[1].items() if k not in varying
    }
    assert loop_answer[2] == thread_answer[2]
    assert loop_lines == thread_lines and len(loop_lines) == 1
    assert (on_loop.hops, on_loop_threads) == (0, [on_loop.thread])
    assert threaded.hops == 1 and threaded.thread not in in_thread_threads


def test_a_run_released_on_the_loop_runs_again_and_a_finished_one_is_a_duplicate(
    loops: list[Loop],
) -> None:
    ran_on: list[int] = []
    store = WatchedMemory()
    running = Loop(outcome_router(ran_on), store)
    loops.append(running)
    assert outcome(running.post("raises", task="t-r")) == (500, "released")
    assert outcome(running.post("raises", task="t-r", retry=1)) == (500, "released")
    assert outcome(running.post("done", task="t-d")) == (200, "processed")
    duplicate = running.post("done", task="t-d", retry=1)
    assert outcome(duplicate) == (200, "duplicate") and duplicate[2]["result"] == {"n": 1}
    assert outcome(running.post("gives_up", task="t-g")) == (500, "released")
    assert outcome(running.post("gives_up", task="t-g", retry=1)) == (200, "failed")
    assert len(ran_on) == 4  # The duplicate and the one past max_attempts ran nothing.
    assert running.hops == 0
    assert set(store.threads) == {running.thread}


def test_the_lease_is_renewed_while_an_async_handler_awaits_on_the_loop(
    loops: list[Loop],
) -> None:
    router, store = Router(), WatchedMemory()

    @router.task("h", lease=timedelta(seconds=1))
    async def h(payload: Any, ctx: TaskContext) -> int:
        deadline = time.monotonic() + 20
        while store.renewals < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # The loop is free: the keeper's threads renew.
        ctx.check_lease()
        return store.renewals

    running = Loop(router, store)
    loops.append(running)
    answer = running.post(task="t-long")
    assert outcome(answer) == (200, "processed")
    assert answer[2]["result"] >= 2
    assert running.hops == 0


def test_check_lease_after_a_takeover_stops_the_handler_on_the_loop_with_409(
    loops: list[Loop],
) -> None:
    router, clock = Router(), FakeClock()
    store = NonblockingSwitchable(MemoryStore())
    side_effects: list[str] = []

    @router.task("h", lease=timedelta(minutes=1))
    async def h(payload: Any, ctx: TaskContext) -> None:
        store.claim(claim_request(ctx.run_id, "newer-attempt"), clock() + timedelta(minutes=2))
        ctx._live.mark_lease_lost()  # What the lease keeper does when it finds the takeover.
        await asyncio.sleep(0)
        ctx.check_lease()
        side_effects.append("should not happen")

    running = Loop(router, store, clock)
    loops.append(running)
    answer = running.post(task="t-taken")
    assert outcome(answer) == (409, "lost_claim")
    assert side_effects == [] and running.hops == 0
    record = store.get(answer[1]["x-tasklease-run-id"])
    assert record is not None
    assert (record.attempt_id, record.status) == ("newer-attempt", RunStatus.IN_PROGRESS)


def test_an_async_handler_cut_off_from_its_store_fences_itself_on_the_loop(
    loops: list[Loop],
) -> None:
    router = Router()
    store = NonblockingSwitchable(MemoryStore())

    @router.task("h", lease=timedelta(seconds=1))
    async def h(payload: Any, ctx: TaskContext) -> None:
        deadline = time.monotonic() + 20
        while not ctx.lease_lost and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # Every renewal fails meanwhile.
        store.down = False
        ctx.check_lease()

    store.down_after_claim = True
    running = Loop(router, store)
    loops.append(running)
    assert outcome(running.post(task="t-cut")) == (409, "lost_claim")
    assert running.hops == 0


def test_a_sync_handler_never_runs_on_the_loop_even_one_returning_a_coroutine(
    loops: list[Loop],
) -> None:
    router, store = Router(), WatchedMemory()
    ran_on: list[str] = []

    @router.task("sync")
    def sync(payload: Any, ctx: TaskContext) -> str:
        ran_on.append(threading.current_thread().name)
        return "sync"

    async def later() -> str:
        ran_on.append(threading.current_thread().name)
        return "later"

    @router.task("returns_coroutine")
    def returns_coroutine(payload: Any, ctx: TaskContext) -> Any:
        return later()

    running = Loop(router, store)
    loops.append(running)
    assert outcome(running.post("sync", task="t-s")) == (200, "processed")
    assert outcome(running.post("returns_coroutine", task="t-c")) == (200, "processed")
    assert running.hops == 2
    assert ran_on[0].startswith("tasklease-delivery")
    assert ran_on[1] == "tasklease-handler-loop"
    assert running.thread not in store.threads


def test_a_store_that_may_block_is_never_called_on_the_loop_for_an_async_handler(
    loops: list[Loop],
) -> None:
    ran_on: list[int] = []
    store = BlockingMemory()
    running = Loop(outcome_router(ran_on), store)
    loops.append(running)
    assert outcome(running.post("done", task="t-b")) == (200, "processed")
    assert outcome(running.post("done", task="t-b", retry=1)) == (200, "duplicate")
    assert running.hops == 2
    assert store.threads and running.thread not in store.threads
    assert running.thread not in ran_on


def test_with_opentelemetry_loaded_an_async_handler_runs_off_the_loop(
    loops: list[Loop], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tasklease.worker.observe.telemetry.opentelemetry_in_use", lambda: True)
    ran_on: list[int] = []
    store = WatchedMemory()
    running = Loop(outcome_router(ran_on), store)
    loops.append(running)
    assert outcome(running.post("done", task="t-o")) == (200, "processed")
    assert running.hops == 1
    assert running.thread not in ran_on and running.thread not in store.threads


def test_a_cancelled_request_releases_the_run_and_stays_cancelled(loops: list[Loop]) -> None:
    router, store = Router(), WatchedMemory()
    started = asyncio.Event()

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> None:
        started.set()
        await asyncio.sleep(30)

    running = Loop(router, store)
    loops.append(running)
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/tasks/h",
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in task_headers().items()],
    }
    sent: list[Message] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    async def cancel_midway() -> bool:
        request = asyncio.ensure_future(running.app(scope, receive, send))
        await started.wait()
        request.cancel()
        try:
            await request
        except asyncio.CancelledError:
            return True
        return False

    assert running.loop.run_until_complete(cancel_midway())
    assert sent == []  # Nobody is there to answer.
    (record,) = [store.get(run_id) for run_id in list(store._records)]
    assert record is not None and record.status is RunStatus.RELEASED


def test_under_uvicorn_an_async_handler_on_memory_store_runs_on_the_servers_loop(
    tmp_path: Path,
) -> None:
    with GunicornWorker(
        # Not tests.support.asgi_apps: FastAPI imports OpenTelemetry.
        "tests.support.async_apps:router",
        store="memory://",
        server="uvicorn",
        workers=1,
        env={"TEST_DIR": str(tmp_path)},
        log_path=tmp_path / "uvicorn.log",
    ) as server:
        headers = task_headers(task="t-uvicorn")
        url = f"{server.url}/tasks/where_async"
        first = requests.post(url, data=b'{"n": 5}', headers=headers, timeout=30)
        headers = task_headers(task="t-uvicorn", retry=1, execution=1)
        again = requests.post(url, data=b'{"n": 5}', headers=headers, timeout=30)
    assert first.headers["X-Tasklease-Outcome"] == "processed"
    assert first.json()["result"] == {"n": 5, "thread": "MainThread"}  # uvicorn's loop.
    assert again.headers["X-Tasklease-Outcome"] == "duplicate"
    assert again.json()["result"] == {"n": 5, "thread": "MainThread"}


class ThreadNotingProducer:
    """Records each continuation it enqueues and the thread that enqueued it."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.keys: list[str] = []

    def enqueue(
        self, task_name: str, payload: Any = None, key: str | None = None, **kw: Any
    ) -> Any:
        self.threads.append(threading.get_ident())
        self.keys.append(str(key))


def test_a_continuations_enqueue_leaves_the_loop_and_the_rest_stays_on_it(
    loops: list[Loop],
) -> None:
    router, store, producer = Router(), WatchedMemory(), ThreadNotingProducer()
    router.use_producer(producer)  # type: ignore[arg-type]
    ran_on: list[int] = []

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> str | None:
        ran_on.append(threading.get_ident())
        if ctx.state is None:
            ctx.continue_later({"i": 1})
            return None
        return "done"

    running = Loop(router, store)
    loops.append(running)
    answer = running.post(task="t-chain")
    assert outcome(answer) == (200, "processed")
    assert answer[2]["message"] == "continued: delivery 1 enqueued"
    assert running.hops == 1  # The enqueue only.
    assert len(producer.keys) == 1 and running.thread not in producer.threads
    assert ran_on == [running.thread] and set(store.threads) == {running.thread}


def test_only_an_asyncio_server_runs_an_async_handler_on_its_own_loop() -> None:
    # Under trio (hypercorn --worker-class trio) no asyncio loop runs: a handler written for
    # asyncio is awaited on tasklease's handler loop instead, as before.
    from tasklease.worker.serving.asgi_routes import _on_asyncio  # noqa: PLC0415 - private helper.

    async def inside() -> bool:
        return _on_asyncio()

    assert not _on_asyncio()
    assert asyncio.run(inside())


def test_a_concurrency_key_is_taken_and_freed_on_the_loop(loops: list[Loop]) -> None:
    router, store = Router(), WatchedMemory()

    @router.task("h", concurrency_key=lambda payload: str(payload["n"]))
    async def h(payload: Any, ctx: TaskContext) -> str | None:
        await asyncio.sleep(0)
        return ctx.lock

    running = Loop(router, store)
    loops.append(running)
    # The second run of the same key runs only if the first freed the key.
    first, second = running.post(task="a"), running.post(task="b")
    assert [outcome(answer) for answer in (first, second)] == [(200, "processed")] * 2
    assert first[2]["result"] is not None and first[2]["result"] == second[2]["result"]
    assert running.hops == 0 and set(store.threads) == {running.thread}


class HeldProducer:
    """A producer whose enqueue waits until the test lets it finish (a slow Cloud Tasks)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.proceed = threading.Event()
        self.keys: list[str] = []

    def enqueue(
        self, task_name: str, payload: Any = None, key: str | None = None, **kw: Any
    ) -> Any:
        self.entered.set()
        self.proceed.wait(10)
        self.keys.append(str(key))


def test_a_request_cancelled_during_a_continuations_enqueue_waits_for_it_before_ending(
    loops: list[Loop],
) -> None:
    """The enqueue goes on in its thread whatever the loop does: a run released under it
    could run again (its retry) while the first delivery still enqueues its continuation.
    As in a delivery thread, the delivery ends once the enqueue has, then stays cancelled."""
    router, store, producer = Router(), WatchedMemory(), HeldProducer()
    router.use_producer(producer)  # type: ignore[arg-type]

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> None:
        ctx.continue_later({"i": 1})

    running = Loop(router, store)
    loops.append(running)
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/tasks/h",
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in task_headers().items()],
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Message) -> None:
        raise AssertionError("nobody is there to answer")

    async def cancel_during_the_enqueue() -> tuple[list[RunStatus | None], bool]:
        request = asyncio.ensure_future(running.app(scope, receive, send))
        while not producer.entered.is_set():
            await asyncio.sleep(0.01)
        request.cancel()
        await asyncio.wait({request}, timeout=0.3)  # Time for a wrong release to happen.
        during = [r.status if r else None for r in map(store.get, list(store._records))]
        producer.proceed.set()
        try:
            await request
        except asyncio.CancelledError:
            return during, True
        return during, False

    during, cancelled = running.loop.run_until_complete(cancel_during_the_enqueue())
    assert during == [RunStatus.IN_PROGRESS]
    assert cancelled
    assert len(producer.keys) == 1
    (record,) = [store.get(run_id) for run_id in list(store._records)]
    assert record is not None and record.continuation_json is not None  # As in a thread.


class HeldStepMemory(WatchedMemory):
    """A store whose step records wait until the test lets them be written."""

    nonblocking = True

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.proceed = threading.Event()

    def record_step(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        self.proceed.wait(10)
        return super().record_step(*args, **kwargs)


def test_a_request_cancelled_while_a_step_is_recorded_keeps_the_step_for_the_retry(
    loops: list[Loop],
) -> None:
    """``astep`` writes its record in a thread, which a cancel does not stop: released
    first, the run refuses the record, and the retry runs the step's effect again."""
    router, store = Router(), HeldStepMemory()
    charges: list[int] = []

    @router.task("h")
    async def h(payload: Any, ctx: TaskContext) -> str:
        def charge() -> str:
            charges.append(ctx.attempt)
            return "charged"

        await ctx.astep("charge", charge)
        if ctx.attempt == 1:
            await asyncio.sleep(30)
        return "done"

    running = Loop(router, store)
    loops.append(running)
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/tasks/h",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (k.lower().encode(), v.encode()) for k, v in task_headers(task="t-step").items()
        ],
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Message) -> None:
        raise AssertionError("nobody is there to answer")

    async def cancel_while_recording() -> bool:
        request = asyncio.ensure_future(running.app(scope, receive, send))
        while not store.entered.is_set():
            await asyncio.sleep(0.01)
        request.cancel()
        await asyncio.wait({request}, timeout=0.3)  # Time for a wrong release to happen.
        store.proceed.set()
        try:
            await request
        except asyncio.CancelledError:
            return True
        return False

    assert running.loop.run_until_complete(cancel_while_recording())
    (record,) = [store.get(run_id) for run_id in list(store._records)]
    assert record is not None and record.status is RunStatus.RELEASED
    again = running.post(task="t-step", retry=1, execution=1)
    assert outcome(again) == (200, "processed")
    assert charges == [1]  # Replayed from its record, not charged again.
