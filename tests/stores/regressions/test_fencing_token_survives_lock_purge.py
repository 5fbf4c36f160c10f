"""Finding: a lock's fencing token went back to 1 once the lapsed lock had been purged, so
successive holders of one key saw 1, 2, 3, 1, and a downstream store keeping the highest
token per key took the stalled old holder's write and refused the new holder's. A lock's
token must grow for the life of its key, whatever a store purged (or a TTL deleted)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import pytest

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core import locking
from tasklease.worker.core.constants import MAX_CLOCK_SKEW
from tasklease.worker.core.records import LockRequest
from tasklease.worker.stores import MemoryStore, SqliteStore
from tasklease.worker.stores.base.locks import LockStore
from tests.support.helpers import FakeClock, job_headers

NOW = datetime(2026, 10, 16, 13, 0, tzinfo=UTC)


def lock_request(run_id: str, attempt_id: str) -> LockRequest:
    return LockRequest("job/nightly", run_id, attempt_id, timedelta(minutes=5), timedelta(hours=1))


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LockStore]:
    made: LockStore = (
        MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "runs.db")
    )
    yield made
    made.close()


def test_successive_runs_of_an_exclusive_job_see_growing_lock_tokens_across_purges(
    store: LockStore,
) -> None:
    router = Router()
    tokens: list[int | None] = []

    @router.scheduled("nightly", lease=timedelta(minutes=1), exclusive=True)
    def nightly(ctx: TaskContext) -> None:
        tokens.append(ctx.lock_fencing_token)

    clock = FakeClock(NOW)
    app = create_app(router, store=store, auth="none", clock=clock)
    name = locking.job_lock_name("nightly", None, None)
    for minute in range(4):
        if minute == 3:  # Each run released the lock; the last one has lapsed by now.
            assert store.purge_expired(clock()) >= 1
            assert store.get_lock(name) is None
        slot = f"2026-10-16T12:{minute}0:00Z"
        response = app.test_client().post("/jobs/nightly", headers=job_headers("nightly", slot))
        assert response.headers["X-Tasklease-Outcome"] == "processed"
        clock.advance(timedelta(minutes=10))
    assert len(tokens) == 4
    assert all(token is not None for token in tokens)
    assert tokens == sorted(cast(set[int], set(tokens))), f"lock tokens went back: {tokens}"


def test_a_grant_after_the_purge_outranks_every_earlier_grant_even_on_a_slower_clock(
    store: LockStore,
) -> None:
    granted = []
    for n in range(4):  # Four holders, each taking and giving back the lock.
        moment = NOW + timedelta(seconds=n)
        granted.append(store.acquire_lock(lock_request(f"run-{n}", f"a{n}"), moment).lock)
        assert store.release_lock("job/nightly", f"a{n}", moment)
    last = granted[-1]
    lapsed = locking.lapses_at(last)
    assert store.purge_expired(lapsed) == 1
    assert store.get_lock("job/nightly") is None
    # The next holder asks right after the purge, from a clock running MAX_CLOCK_SKEW behind.
    again = store.acquire_lock(lock_request("run-9", "a9"), lapsed - MAX_CLOCK_SKEW)
    assert again.acquired
    tokens = [lock.fencing_token for lock in granted]
    assert tokens == sorted(set(tokens))
    assert again.lock.fencing_token > tokens[-1]
