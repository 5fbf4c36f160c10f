"""A store written outside tasklease, implementing only the primitives runs need.

It proves itself with the shipped contract suite, as a user's store would. ``create_app``
refuses, at start, the handlers and features such a store cannot serve (a lock found missing
after the claim would be a 500 on every delivery), and serves the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime
from typing import ClassVar, TypeVar

import pytest

from tasklease.errors import ConfigurationError
from tasklease.testing.store_contract import StoreContract
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.stores.base import Change, LeaseStore
from tests.support.helpers import task_headers

_T = TypeVar("_T")


class DictStore(LeaseStore):
    """Run records in a dict behind one lock: the required primitives and nothing else."""

    shared_across_instances: ClassVar[bool] = False

    def __init__(self) -> None:
        self._records: dict[str, RunRecord] = {}
        self._lock = threading.Lock()

    def _read_modify_write(self, run_id: str, change: Change[_T]) -> _T:
        with self._lock:
            new_record, value = change(self._records.get(run_id))
            if new_record is not None:
                self._records[run_id] = new_record
            return value

    def get(self, run_id: str) -> RunRecord | None:
        with self._lock:
            return self._records.get(run_id)

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        with self._lock:
            records = [r for r in self._records.values() if status in (None, r.status)]
        return sorted(records, key=lambda r: r.claimed_at, reverse=True)[:limit]

    def purge_expired(self, now: datetime) -> int:
        with self._lock:
            expired = [key for key, r in self._records.items() if r.expire_at <= now]
            for key in expired:
                del self._records[key]
            return len(expired)

    def __repr__(self) -> str:
        return "DictStore()"


class TestDictStore(StoreContract):
    """The whole run contract holds for a store of the required primitives only."""

    @pytest.fixture
    def store(self) -> Iterator[DictStore]:
        store = DictStore()
        yield store
        store.close()


def test_an_exclusive_job_on_a_store_without_locks_is_refused_at_start() -> None:
    router = Router()

    @router.scheduled("nightly", exclusive=True)
    def nightly(ctx: TaskContext) -> None: ...

    with pytest.raises(ConfigurationError) as refused:
        create_app(router, store=DictStore(), auth="none")
    assert "/jobs/nightly" in str(refused.value)
    assert "DictStore()" in str(refused.value)
    assert "LockStore" in str(refused.value)


def test_a_concurrency_key_on_a_store_without_locks_is_refused_at_start() -> None:
    router = Router()

    @router.task("charge", concurrency_key=lambda payload: payload["account"])
    def charge(payload: dict[str, str], ctx: TaskContext) -> None: ...

    with pytest.raises(ConfigurationError) as refused:
        create_app(router, store=DictStore(), auth="none")
    assert "/tasks/charge" in str(refused.value)
    assert "concurrency_key" in str(refused.value)
    assert "DictStore()" in str(refused.value)


def test_the_dashboard_on_a_store_without_operator_queries_is_refused_at_start() -> None:
    with pytest.raises(ConfigurationError) as refused:
        create_app(
            Router(),
            store=DictStore(),
            auth="oidc",
            audience="https://worker.example.com",
            dashboard="/tasklease",
            dashboard_operators=["ops@example.com"],
            dashboard_audience="https://board.example.com",
        )
    assert "/tasklease" in str(refused.value)
    assert "DictStore()" in str(refused.value)


def test_plain_handlers_run_exactly_once_on_a_store_of_run_primitives_only() -> None:
    router = Router()
    calls: list[str] = []

    @router.task("send")
    def send(payload: dict[str, str], ctx: TaskContext) -> dict[str, str]:
        calls.append(payload["to"])
        return {"sent": payload["to"]}

    store = DictStore()
    client = create_app(router, store=store, auth="none").test_client()
    for _ in range(2):  # The second delivery is a duplicate: answered from the record.
        response = client.post("/tasks/send", json={"to": "a@example.com"}, headers=task_headers())
        assert response.status_code == 200
    assert calls == ["a@example.com"]
    assert [record.status for record in store.list_runs()] == [RunStatus.COMPLETED]
