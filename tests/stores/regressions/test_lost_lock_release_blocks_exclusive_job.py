"""Finding: an exclusive run that completed although its lock release failed kept the job
locked until ``started + max_runtime``: nothing released the lock afterwards, and the lock
rule never looked at whether the holder's run had finished, so the next runs were answered
200 ``skipped_overlap`` and lost (1 of 5 runs executed). A lock whose holding attempt has
recorded its run's end is free for the next run."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease.errors import StoreUnavailable
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core import locking
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores import MemoryStore, SqliteStore
from tasklease.worker.stores.base import retries as store_retries
from tasklease.worker.stores.base.locks import LockStore
from tasklease.worker.stores.base.store import Moment
from tests.support.helpers import FakeClock, job_headers

NOW = datetime(2026, 10, 16, 13, 0, tzinfo=UTC)


class LosesReleases:
    """A store whose lock releases never land (the store fails just then, every retry)."""

    def release_lock(self, name: str, attempt_id: str, now: Moment) -> bool:
        raise StoreUnavailable("the release of the lock failed")


class MemoryLosingReleases(LosesReleases, MemoryStore):
    pass


class SqliteLosingReleases(LosesReleases, SqliteStore):
    pass


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LockStore]:
    made: LockStore = (
        MemoryLosingReleases()
        if request.param == "memory"
        else SqliteLosingReleases(tmp_path / "runs.db")
    )
    yield made
    made.close()


def test_runs_after_a_completed_run_whose_lock_release_failed_still_run(
    store: LockStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_retries, "FINISH_RETRY_PAUSES", (0.001,))
    router = Router()
    ran: list[str] = []

    @router.scheduled(
        "nightly", lease=timedelta(minutes=1), exclusive=True, max_runtime=timedelta(hours=2)
    )
    def nightly(ctx: TaskContext) -> None:
        ran.append(ctx.run_id)

    clock = FakeClock(NOW)
    app = create_app(router, store=store, auth="none", clock=clock)
    outcomes: list[Any] = []
    for minute in range(5):
        slot = f"2026-10-16T12:{minute}0:00Z"
        response = app.test_client().post("/jobs/nightly", headers=job_headers("nightly", slot))
        outcomes.append(response.headers["X-Tasklease-Outcome"])
        clock.advance(timedelta(minutes=10))
    assert outcomes == ["processed"] * 5
    assert len(ran) == 5
    lock = store.get_lock(locking.job_lock_name("nightly", None, None))
    assert lock is not None
    assert not lock.released  # Never released: the finished holder's record freed it.
    holder = store.get(lock.holder_run_id)
    assert holder is not None
    assert holder.status is RunStatus.COMPLETED
