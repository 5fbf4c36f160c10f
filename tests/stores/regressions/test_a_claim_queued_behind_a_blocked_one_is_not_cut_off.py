"""A claim queued behind (and batched with) one that waits on a row lock is not held up
past its own deadline: it ends as it would alone, claimed at once.

With group commit a statement waiting on a lock (a duplicate delivery's claim of a row
another transaction is updating) held every claim the process sent meanwhile: first the
queue behind it, then the batch it joined, which waited on the same lock until the
leader's own deadline cut the batch, and the unrelated claim with it (503).
"""

from __future__ import annotations

import pytest

from tasklease.errors import StoreUnavailable
from tasklease.worker.core.records import Verdict
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support import postgres as postgres_support
from tests.support.helpers import T0, claim_request
from tests.support.row_locks import LOCK_WAITERS, ThreadedClaims, row_locked, wait_for

pytestmark = pytest.mark.service


def test_a_claim_sent_while_another_waits_on_a_row_lock_is_claimed_at_once(
    postgres_url: str, postgres_cluster: postgres_support.Cluster
) -> None:
    store = PostgresStore.from_url(f"{postgres_url}&server_clock=off&statement_timeout=2")
    schema = store.options.schema
    assert store.claim(claim_request("ra", "a-1"), T0).verdict is Verdict.CLAIMED
    claims = store.connections.process().claims
    sent = ThreadedClaims(store)
    outcomes = sent.outcomes
    with row_locked(postgres_cluster, schema, "ra"):
        blocked = sent.start("ra", "a-2")
        wait_for(lambda: postgres_cluster.sql(LOCK_WAITERS) == [(1,)], "the claim of ra waiting")
        unrelated = sent.start("rb", "b-1")
        wait_for(lambda: bool(claims._queue) or "b-1" in outcomes, "rb sent or queued")
        duplicate = sent.start("ra", "a-3")
        for thread in (blocked, unrelated, duplicate):
            thread.join(30)
    assert outcomes["b-1"] is Verdict.CLAIMED
    assert isinstance(outcomes["a-2"], StoreUnavailable)  # As alone: its lock never came.
    store.close()
