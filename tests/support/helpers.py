"""Shared test helpers: a controllable clock, delivery headers, a store that fails on demand."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypedDict

from tasklease.errors import StoreUnavailable
from tasklease.testing.contract_support import T0, claim_request
from tasklease.worker.core.records import Claim, ClaimRequest, LockRecord, RunRecord, RunStatus
from tasklease.worker.stores.base.locks import LockStore, lock_store
from tasklease.worker.stores.base.store import LeaseStore, Moment


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.now

    def advance(self, delta: timedelta) -> None:
        with self._lock:
            self.now += delta


class TaskHeaderFields(TypedDict, total=False):
    """task_headers' own parameters, for helpers that pass them through."""

    queue: str
    task: str
    retry: int
    execution: int
    eta: float | None


def task_headers(
    queue: str = "default",
    task: str = "task-1",
    retry: int = 0,
    execution: int = 0,
    eta: float | None = 1_792_152_000.5,
    **extra: str,
) -> dict[str, str]:
    headers = {
        "X-CloudTasks-QueueName": queue,
        "X-CloudTasks-TaskName": task,
        "X-CloudTasks-TaskRetryCount": str(retry),
        "X-CloudTasks-TaskExecutionCount": str(execution),
    }
    if eta is not None:
        headers["X-CloudTasks-TaskETA"] = str(eta)
    headers.update(extra)
    return headers


def job_headers(
    job: str = "nightly", schedule_time: str = "2026-10-16T12:00:00Z"
) -> dict[str, str]:
    return {
        "X-CloudScheduler": "true",
        "X-CloudScheduler-JobName": job,
        "X-CloudScheduler-ScheduleTime": schedule_time,
    }


class SwitchableStore(LockStore):
    """Wraps a store; while ``down`` is set, every call raises StoreUnavailable."""

    def __init__(self, inner: LeaseStore) -> None:
        self.inner = inner
        self.down = False
        self.down_after_claim = False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("store switched off by the test")

    def _read_modify_write(self, run_id: str, change: Any) -> Any:
        self._check()
        return self.inner._read_modify_write(run_id, change)

    def claim(self, request: ClaimRequest, now: Moment) -> Claim:
        self._check()
        claim = self.inner.claim(request, now)
        if self.down_after_claim:
            self.down = True
        return claim

    def get(self, run_id: str) -> RunRecord | None:
        return self.inner.get(run_id)

    def _read_modify_write_lock(self, name: str, change: Any) -> Any:
        self._check()
        return lock_store(self.inner)._read_modify_write_lock(name, change)

    def get_lock(self, name: str) -> LockRecord | None:
        return lock_store(self.inner).get_lock(name)

    def list_locks(self, limit: int = 100) -> list[LockRecord]:
        return lock_store(self.inner).list_locks(limit)

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        return self.inner.list_runs(status, limit)

    def purge_expired(self, now: datetime) -> int:
        self._check()
        return self.inner.purge_expired(now)


__all__ = ["T0", "FakeClock", "SwitchableStore", "claim_request", "job_headers", "task_headers"]


class CapturingProducer:
    """A router's producer that keeps the tasks the worker enqueues (continuations), by key:
    a key enqueued again is kept once, as Cloud Tasks keeps one task per name."""

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}

    def enqueue(
        self, task_name: str, payload: Any = None, key: str | None = None, **kw: Any
    ) -> Any:
        assert key is not None
        self.tasks.setdefault(key, {"name": task_name, "payload": payload, **kw})


def wait_for(condition: Callable[[], object], seconds: float = 10.0) -> bool:
    """Whether ``condition()`` came true within ``seconds``, polled every 20 ms."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False
