"""A retry of a settled run answered on the ASGI event loop, from a store that never waits.

MemoryStore with authentication off is read on the loop (no thread hop) for a retry; every
other store, an OIDC check, a first delivery and every handler stay in a delivery thread. The
answer on the loop is the thread's, byte for byte, with the same log line; and since each
answer reads the record, a run that was reopened (released for a retry, released by an
operator, purged) runs again instead of being answered from what it was.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from tasklease.worker import Router, TaskContext
from tasklease.worker.asgi import AsgiDeliveries, create_asgi_app
from tasklease.worker.core.identity import Kind, parse_identity
from tasklease.worker.core.records import ClaimRequest
from tasklease.worker.delivery.auth import NoAuth, OidcAuth
from tasklease.worker.delivery.executor import utc_now
from tasklease.worker.observe.logs import FIELDS_ATTRIBUTE
from tasklease.worker.runtime.settled_answers import answers_on_loop
from tasklease.worker.serving.asgi_routes import Message
from tasklease.worker.stores import MemoryStore, SqliteStore
from tests.support.helpers import task_headers

Answer = tuple[int, dict[str, str], bytes]


class Worker:
    """An ASGI app on MemoryStore, driven in process, that records where things ran."""

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.store = store or MemoryStore()
        self.handler_threads: list[int] = []
        self.hops = 0
        self.fail_next = False
        router = Router()

        @router.task("record")
        def record(payload: Any, ctx: TaskContext) -> dict[str, Any]:
            self.handler_threads.append(threading.get_ident())
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("try again")
            return {"n": payload["n"]}

        self.app: AsgiDeliveries = create_asgi_app(router, store=self.store, auth="none")
        in_thread = self.app._in_thread

        async def counted(function: Any) -> Any:
            self.hops += 1
            return await in_thread(function)

        self.app._in_thread = counted  # type: ignore[method-assign]
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.get_ident()  # run_until_complete runs it on this thread.

    def post(self, task: str, retry: int, body: bytes = b'{"n": 1}') -> Answer:
        headers = {**task_headers(task=task, retry=retry, execution=retry)}
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/tasks/record",
            "root_path": "",
            "query_string": b"",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]
            + [(b"content-length", str(len(body)).encode())],
        }
        sent: list[Message] = []
        received = False

        async def receive() -> dict[str, Any]:
            nonlocal received
            assert not received, "the body is read once"
            received = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: Message) -> None:
            sent.append(message)

        self.loop.run_until_complete(self.app(scope, receive, send))
        start, body_message = sent
        answer_headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
        return start["status"], answer_headers, body_message["body"]

    def close(self) -> None:
        if self.app._pool is not None:
            self.app._pool.close()
        self.loop.close()


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Worker]:
    # Another test in this process may have loaded OpenTelemetry, which keeps every delivery
    # in a thread (a delivery given up for a claim would leave a span); these tests are about
    # the loop path.
    monkeypatch.setattr("tasklease.worker.observe.telemetry.opentelemetry_in_use", lambda: False)
    running = Worker()
    yield running
    running.close()


def outcome(answer: Answer) -> tuple[int, str]:
    return answer[0], answer[1]["x-tasklease-outcome"]


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, dict[str, Any]]]:
    varying = ("duration_ms",)
    return [
        (
            record.getMessage(),
            {k: v for k, v in getattr(record, FIELDS_ATTRIBUTE, {}).items() if k not in varying},
        )
        for record in caplog.records
        if record.name == "tasklease.execution"
    ]


def test_a_retry_of_a_completed_run_is_answered_on_the_loop_without_a_thread(
    worker: Worker,
) -> None:
    assert outcome(worker.post("t-1", retry=0)) == (200, "processed")
    assert worker.hops == 1
    duplicate = worker.post("t-1", retry=1)
    assert outcome(duplicate) == (200, "duplicate")
    assert worker.hops == 1  # Answered on the loop.
    assert len(worker.handler_threads) == 1
    assert worker.loop_thread not in worker.handler_threads


def test_the_answer_on_the_loop_is_the_threads_byte_for_byte_with_the_same_log_line(
    worker: Worker, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="tasklease")
    worker.post("t-1", retry=0)
    caplog.clear()
    on_loop = worker.post("t-1", retry=3)
    assert worker.hops == 1
    monkeypatch.setattr(MemoryStore, "nonblocking", False)
    in_thread = worker.post("t-1", retry=3)
    assert worker.hops == 2
    assert on_loop == in_thread
    assert on_loop[2].endswith(b',"result":{"n":1}}')
    loop_line, thread_line = lines(caplog)
    assert loop_line == thread_line
    assert loop_line[0] == "task record: already completed"


def test_a_first_delivery_and_every_handler_run_in_a_delivery_thread(worker: Worker) -> None:
    assert outcome(worker.post("t-first", retry=0)) == (200, "processed")
    # A retry of a run never seen here: the loop reads nothing settled, a thread claims it.
    assert outcome(worker.post("t-unseen", retry=2)) == (200, "processed")
    assert worker.hops == 2
    assert len(worker.handler_threads) == 2
    assert worker.loop_thread not in worker.handler_threads


def test_a_run_released_for_a_retry_runs_again_instead_of_being_answered_on_the_loop(
    worker: Worker,
) -> None:
    worker.fail_next = True
    assert outcome(worker.post("t-1", retry=0)) == (500, "released")
    assert outcome(worker.post("t-1", retry=1)) == (200, "processed")
    assert len(worker.handler_threads) == 2
    assert worker.hops == 2
    assert outcome(worker.post("t-1", retry=2)) == (200, "duplicate")
    assert worker.hops == 2


def test_a_run_an_operator_released_is_claimed_again_not_answered_from_its_old_record(
    worker: Worker,
) -> None:
    # A first attempt that took the claim and stopped (a crash): retries are answered 409,
    # by a thread (a live lease is not settled: the claim decides).
    worker.store.claim(claim_request(worker, "t-1"), utc_now)
    assert outcome(worker.post("t-1", retry=1)) == (409, "in_progress")
    assert worker.hops == 1
    [run] = worker.store.list_runs()
    released = worker.store.operator_release(run.run_id, utc_now, force=True)
    assert released.outcome.value == "released"
    assert outcome(worker.post("t-1", retry=2)) == (200, "processed")
    assert worker.hops == 2
    assert len(worker.handler_threads) == 1
    assert outcome(worker.post("t-1", retry=3)) == (200, "duplicate")
    assert worker.hops == 2


def test_a_purged_run_runs_again_instead_of_being_answered_as_a_duplicate(
    worker: Worker,
) -> None:
    assert outcome(worker.post("t-1", retry=0)) == (200, "processed")
    assert outcome(worker.post("t-1", retry=1)) == (200, "duplicate")
    [run] = worker.store.list_runs()
    assert worker.store.purge_expired(run.expire_at + timedelta(seconds=1)) == 1
    assert outcome(worker.post("t-1", retry=2)) == (200, "processed")
    assert len(worker.handler_threads) == 2
    assert worker.hops == 2


def test_only_memory_store_with_authentication_off_and_no_opentelemetry_is_read_on_the_loop(
    worker: Worker, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert answers_on_loop(worker.app.executor)
    executor = worker.app.executor
    with monkeypatch.context() as patch:
        patch.setattr(
            executor,
            "authenticator",
            OidcAuth(["tasks@p.iam.gserviceaccount.com"], audience="https://w.example"),
        )
        assert not answers_on_loop(executor)
    sqlite = SqliteStore(str(tmp_path / "runs.db"))
    try:
        with monkeypatch.context() as patch:
            patch.setattr(executor, "store", sqlite)
            assert not answers_on_loop(executor)
    finally:
        sqlite.close()
    monkeypatch.setattr("tasklease.worker.observe.telemetry.opentelemetry_in_use", lambda: True)
    assert not answers_on_loop(executor)
    assert NoAuth.nonblocking and not OidcAuth.nonblocking


def test_a_subclass_of_memory_store_or_no_auth_is_not_nonblocking_unless_it_says_so() -> None:
    class Slow(MemoryStore):
        def get(self, run_id: str) -> Any:
            return super().get(run_id)

    class SaysSo(MemoryStore):
        nonblocking = True

    class Checking(NoAuth):
        pass

    assert MemoryStore.nonblocking
    assert not Slow.nonblocking
    assert NoAuth.nonblocking and not Checking.nonblocking
    assert SaysSo.nonblocking
    assert not SqliteStore.nonblocking


def test_a_subclassed_memory_store_keeps_every_read_in_a_delivery_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("tasklease.worker.observe.telemetry.opentelemetry_in_use", lambda: False)

    class Watched(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.read_on: list[int] = []

        def get(self, run_id: str) -> Any:
            self.read_on.append(threading.get_ident())
            return super().get(run_id)

    store = Watched()
    running = Worker(store)
    try:
        running.post("t-1", retry=0)
        assert outcome(running.post("t-1", retry=1)) == (200, "duplicate")
    finally:
        running.close()
    assert running.hops == 2
    assert store.read_on and running.loop_thread not in store.read_on


def claim_request(worker: Worker, task: str) -> ClaimRequest:
    headers = {k.lower(): [v] for k, v in task_headers(task=task).items()}
    identity = parse_identity(Kind.TASK, "record", lambda name: headers.get(name.lower(), []), {})
    spec = worker.app.executor.router.handler(Kind.TASK, "record")
    assert spec is not None
    return ClaimRequest(
        run_id=identity.run_id,
        kind="task",
        handler="record",
        attempt_id="a-crashed",
        lease=spec.lease,
        retention=spec.retention,
        identity=identity.fields(),
    )
