"""A claim waiting on a row lock holds its own connection, not the process's others.

With group commit a lone claim in flight holds the process's group: every claim sent
meanwhile queues behind it, each on a pooled connection of its own, idle. A lone claim
that waits on a row lock (a duplicate delivery's, of a run another transaction is
writing) then held as many connections as claims arrived for up to ``statement_timeout``:
a pool smaller than the request threads ran out, and unrelated claims answered 503 where
alone they are claimed at once.
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


def test_claims_sent_while_one_waits_on_a_row_lock_are_claimed_on_a_small_pool(
    postgres_url: str, postgres_cluster: postgres_support.Cluster
) -> None:
    store = PostgresStore.from_url(
        f"{postgres_url}&server_clock=off&statement_timeout=3&pool_timeout=1&max_size=3"
    )
    schema = store.options.schema
    assert store.claim(claim_request("ra", "a-1"), T0).verdict is Verdict.CLAIMED
    claims = store.connections.process().claims
    sent = ThreadedClaims(store)
    outcomes = sent.outcomes
    with row_locked(postgres_cluster, schema, "ra"):
        blocked = sent.start("ra", "a-2")
        wait_for(lambda: postgres_cluster.sql(LOCK_WAITERS) == [(1,)], "the claim of ra waiting")
        others = [sent.start(f"r{n}", f"b-{n}") for n in range(2)]
        wait_for(
            lambda: len(claims._queue) == 2 or {"b-0", "b-1"} <= outcomes.keys(),
            "the two claims sent or queued",
        )
        last = sent.start("r2", "b-2")  # The pool's 4th call.
        for thread in (blocked, *others, last):
            thread.join(30)
    assert [outcomes[f"b-{n}"] for n in range(3)] == [Verdict.CLAIMED] * 3
    assert isinstance(outcomes["a-2"], StoreUnavailable)  # As alone: its lock never came.
    store.close()
