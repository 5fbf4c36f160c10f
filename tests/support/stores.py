"""Shared by the store tests: stores closed after the test that opened them, a SQLite store
beside the application's own tables, and a worker with one task that notes each run of its
handler."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Protocol, TypeVar

from werkzeug.test import TestResponse

from tasklease.worker import Router, create_app
from tasklease.worker.stores.base.store import LeaseStore
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import task_headers


class _Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)

_open: list[_Closable] = []


def closed_after_the_test(store: C) -> C:
    """``store``, closed when the test ends (tests/stores/conftest.py closes them)."""
    _open.append(store)
    return store


def close_opened() -> None:
    while _open:
        _open.pop().close()


class ReceiptWorker:
    """A worker on ``store`` (auth off) with one ``send_receipt`` task; ``runs`` holds the
    run id of each run of its handler."""

    def __init__(self, store: LeaseStore, **task_options: Any) -> None:
        self.runs: list[str] = []
        router = Router()
        router.task("send_receipt", **task_options)(
            lambda payload, ctx: self.runs.append(ctx.run_id)
        )
        self.client = create_app(router, store=store, auth="none").test_client()

    def deliver(self, retry: int = 0) -> TestResponse:
        """One delivery of the task ``task-1``, the ``retry``-th retry of it."""
        return self.client.post(
            "/tasks/send_receipt", headers=task_headers(retry=retry), data=b"{}"
        )

    def outcomes(self, deliveries: int) -> list[str]:
        """The X-Tasklease-Outcome of each of ``deliveries`` first deliveries of the task."""
        return [self.deliver().headers["X-Tasklease-Outcome"] for _ in range(deliveries)]


def sqlite_store_with(path: Path, *statements: str) -> SqliteStore:
    """A SqliteStore on ``path``, its file and tables made, then the application's own
    ``statements`` (its tables, its rows) run in the same file."""
    store = SqliteStore(path)
    store.get("warm-up")  # Creates the file and the store's tables.
    with sqlite3.connect(path) as connection:
        for statement in statements:
            connection.execute(statement)
    return store
