"""A stalled attempt (SIGSTOP, a long pause) can outlive its run's record: once its lease
and the run's retention have passed, a purge deletes the row and the run's next delivery
claims it anew. The stalled attempt's late finish must then be refused, as any stale
attempt's is. PostgresStore conditions the writes of the process that claimed on the
version of its own last write; a new row starts its versions again at 1, so a remembered
version could match the new attempt's row and the stale finish be written onto it (only the
columns it changed: the row kept the new attempt's id, with the old one's outcome)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from tasklease.testing.contract_support import T0
from tasklease.worker.core.records import ClaimRequest, RunStatus, Verdict
from tasklease.worker.stores.base.store import LeaseStore
from tasklease.worker.stores.memory.store import MemoryStore
from tasklease.worker.stores.sqlite.store import SqliteStore

LEASE = timedelta(seconds=30)
RETENTION = timedelta(minutes=2)


def _request(attempt_id: str) -> ClaimRequest:
    return ClaimRequest(
        run_id="r" * 64,
        kind="task",
        handler="charge",
        attempt_id=attempt_id,
        lease=LEASE,
        retention=RETENTION,
    )


@pytest.fixture(params=["postgres", "sqlite", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LeaseStore]:
    if request.param == "postgres":
        from tasklease.worker.stores.postgres.store import PostgresStore  # noqa: PLC0415

        url: str = request.getfixturevalue("postgres_url")
        made: LeaseStore = PostgresStore.from_url(url)
    elif request.param == "sqlite":
        made = SqliteStore(tmp_path / "runs.db")
    else:
        made = MemoryStore()
    yield made
    close = getattr(made, "close", None)
    if close is not None:
        close()


@pytest.mark.parametrize("renewals", [0, 2])
def test_a_stalled_attempts_finish_is_refused_once_its_run_was_purged_and_claimed_again(
    store: LeaseStore, renewals: int
) -> None:
    stale = store.claim(_request("stale"), T0)
    assert stale.verdict is Verdict.CLAIMED
    for n in range(renewals):
        assert store.renew("r" * 64, "stale", LEASE, T0 + timedelta(seconds=n + 1)) is not None
    later = T0 + timedelta(minutes=10)  # Past the lease and the retention: the row goes.
    assert store.purge_expired(later) >= 1
    assert store.get("r" * 64) is None
    fresh = store.claim(_request("fresh"), later)
    assert fresh.verdict is Verdict.CLAIMED
    for n in range(renewals):  # The new row's versions climb to the stale attempt's.
        assert store.renew("r" * 64, "fresh", LEASE, later + timedelta(seconds=n + 1)) is not None

    # The stalled attempt wakes and finishes: refused, the new attempt's record untouched.
    at = later + timedelta(seconds=5)
    assert not store.complete("r" * 64, "stale", '{"charged": "twice"}', at)
    assert store.renew("r" * 64, "stale", LEASE, at) is None
    record = store.get("r" * 64)
    assert record is not None
    assert (record.attempt_id, record.status, record.result_json) == (
        "fresh",
        RunStatus.IN_PROGRESS,
        None,
    )
    assert store.complete("r" * 64, "fresh", '{"charged": "once"}', at)
    done = store.get("r" * 64)
    assert done is not None and done.result_json == '{"charged": "once"}'
