"""A claim queued behind (and batched with) one that waits on a row lock is not held up
past its own deadline: it ends as it would alone, claimed at once.

With group commit a statement waiting on a lock (a duplicate delivery's claim of a row
another transaction is updating) held every claim the process sent meanwhile: first the
queue behind it, then the batch it joined, which waited on the same lock until the
leader's own deadline cut the batch, and the unrelated claim with it (503).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tasklease.errors import StoreUnavailable
from tasklease.worker.core.records import Verdict
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support import postgres as postgres_support
from tests.support.helpers import T0, claim_request

pytestmark = pytest.mark.service


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def test_a_claim_sent_while_another_waits_on_a_row_lock_is_claimed_at_once(
    postgres_url: str, postgres_cluster: postgres_support.Cluster
) -> None:
    store = PostgresStore.from_url(f"{postgres_url}&server_clock=off&statement_timeout=2")
    schema = store.options.schema
    assert store.claim(claim_request("ra", "a-1"), T0).verdict is Verdict.CLAIMED
    claims = store.connections.process().claims
    outcomes: dict[str, Any] = {}

    def claim(run: str, attempt: str) -> None:
        try:
            outcomes[attempt] = store.claim(claim_request(run, attempt), T0).verdict
        except StoreUnavailable as exc:
            outcomes[attempt] = exc

    waiting = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tasklease' "
        "AND wait_event_type = 'Lock'"
    )
    with psycopg.connect(postgres_cluster.url()) as blocker:
        # An update in flight on run ra: a claim of ra waits for it (ON CONFLICT).
        blocker.execute(f"UPDATE {schema}.runs SET version = version WHERE run_id = 'ra'")
        blocked = threading.Thread(target=claim, args=("ra", "a-2"))
        blocked.start()
        wait_for(lambda: postgres_cluster.sql(waiting) == [(1,)], "the claim of ra waiting")
        unrelated = threading.Thread(target=claim, args=("rb", "b-1"))
        unrelated.start()
        wait_for(lambda: bool(claims._queue) or "b-1" in outcomes, "rb sent or queued")
        duplicate = threading.Thread(target=claim, args=("ra", "a-3"))
        duplicate.start()
        for thread in (blocked, unrelated, duplicate):
            thread.join(30)
        blocker.rollback()
    assert outcomes["b-1"] is Verdict.CLAIMED
    assert isinstance(outcomes["a-2"], StoreUnavailable)  # As alone: its lock never came.
    store.close()
