"""The handler call in progress (``tasklease.worker.runtime.running``): the keys it gives the
tasks a handler enqueues without naming them (Django's ``enqueue()``), the same on every try of the
handler's code within a run, and none outside a handler."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease.worker import Router, create_app
from tasklease.worker.asgi import create_asgi_app
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.runtime.running import current_call, handler_call
from tasklease.worker.stores.base.transactional import TransactionOutcome, Work
from tasklease.worker.stores.memory.store import MemoryStore
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import task_headers


class AbortingOnceStore(SqliteStore):
    """A SQLite store whose database aborts each transaction's first try and runs its work
    again, as Spanner and Firestore do on a conflict."""

    def complete_in_transaction(
        self,
        run_id: str,
        attempt_id: str,
        work: Work,
        now: Any,
        *,
        keep_for: timedelta | None = None,
    ) -> TransactionOutcome:
        def tried_twice(transaction: Any) -> str | None:
            work(transaction)  # Aborted: its writes never commit.
            return work(transaction)

        return super().complete_in_transaction(
            run_id, attempt_id, tried_twice, now, keep_for=keep_for
        )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    store = AbortingOnceStore(tmp_path / "runs.db")
    yield store
    store.close()


def _key() -> str:
    call = current_call()
    assert call is not None, "not inside a handler call"
    return call.next_enqueue_key("app.tasks.send", "default")


def _deliver(app: Any, name: str, retry: int = 0) -> str:
    response = app.test_client().post(
        f"/tasks/{name}", headers=task_headers(retry=retry, execution=retry), data=b"{}"
    )
    outcome: str = response.headers["X-Tasklease-Outcome"]
    return outcome


def test_outside_a_handler_there_is_no_call() -> None:
    assert current_call() is None


def test_the_nth_enqueue_of_a_task_has_the_same_key_in_every_call_of_a_run() -> None:
    keys = []
    for _ in range(2):
        with handler_call("run-1", "ship") as call:
            keys.append([call.next_enqueue_key("app.tasks.send", "default") for _ in range(2)])
            keys[-1].append(call.next_enqueue_key("app.tasks.other", "default"))
    assert keys[0] == keys[1]
    assert len(set(keys[0])) == 3
    with handler_call("run-2", "ship") as other_run, handler_call("run-1", "ship", 1) as later:
        assert other_run.next_enqueue_key("app.tasks.send", "default") not in keys[0]
        assert later.next_enqueue_key("app.tasks.send", "default") not in keys[0]


def test_the_asyncio_tasks_and_threads_of_a_call_share_its_count() -> None:
    with handler_call("run-1", "ship"):
        expected = [_key() for _ in range(3)]

    async def handler() -> list[str]:
        first = await asyncio.to_thread(_key)
        return [first, *await asyncio.gather(asyncio.to_thread(_key), asyncio.to_thread(_key))]

    with handler_call("run-1", "ship"):
        keys = asyncio.run(handler())
    assert keys[0] == expected[0]
    assert sorted(keys[1:]) == sorted(expected[1:])  # Concurrent: in the order they ran.


def test_a_thread_the_handler_starts_itself_is_outside_the_call() -> None:
    seen: list[object] = []
    with handler_call("run-1", "ship"):
        worker = threading.Thread(target=lambda: seen.append(current_call()))
        worker.start()
        worker.join()
    assert seen == [None]


def test_a_transactional_handler_tried_again_enqueues_the_tasks_of_its_first_try(
    store: SqliteStore,
) -> None:
    router = Router()
    keys: list[list[str]] = []

    @router.task("ship", transactional=True)
    def ship(payload: Any, ctx: TaskContext) -> None:
        keys.append([_key(), _key()])

    app = create_app(router, store=store, auth="none")
    assert _deliver(app, "ship") == "processed"
    first, second = keys
    assert first == second
    assert first[0] != first[1]


def test_a_step_names_its_enqueues_apart_from_the_handlers(store: SqliteStore) -> None:
    router = Router()
    keys: list[tuple[str, str]] = []

    @router.task("ship")
    def ship(payload: Any, ctx: TaskContext) -> None:
        in_step = ctx.step("label", _key)
        keys.append((in_step, _key()))
        if ctx.attempt == 1:
            raise ConnectionError("retried after its enqueues")

    app = create_app(router, store=store, auth="none")
    assert _deliver(app, "ship") == "released"
    assert _deliver(app, "ship", retry=1) == "processed"
    (step_key, handler_key), (replayed, retried_key) = keys
    assert replayed == step_key  # The step's recorded result: its function not called.
    assert retried_key == handler_key != step_key


def _post_asgi(app: Any, name: str, retry: int) -> str:
    """One delivery to the ASGI app, driven on an event loop of this thread."""
    headers = task_headers(retry=retry, execution=retry)
    scope = {
        "type": "http",
        "method": "POST",
        "path": f"/tasks/{name}",
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        + [(b"content-length", b"2")],
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    answer: dict[str, str] = {k.decode().lower(): v.decode() for k, v in sent[0]["headers"]}
    return answer["x-tasklease-outcome"]


def test_an_async_handler_served_by_the_asgi_app_enqueues_the_tasks_of_its_first_attempt() -> None:
    router = Router()
    keys: list[list[str]] = []

    @router.task("ship")
    async def ship(payload: Any, ctx: TaskContext) -> None:
        await asyncio.sleep(0)
        keys.append([_key(), await asyncio.to_thread(_key)])
        if ctx.attempt == 1:
            raise ConnectionError("retried after its enqueues")

    app = create_asgi_app(router, store=MemoryStore(), auth="none")
    assert _post_asgi(app, "ship", 0) == "released"
    assert _post_asgi(app, "ship", 1) == "processed"
    first, retried = keys
    assert first == retried
