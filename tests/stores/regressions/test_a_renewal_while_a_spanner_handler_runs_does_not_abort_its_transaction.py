"""A lease renewal committed while a transactional handler runs must leave the handler's
Spanner transaction alone: the transaction read the run's row (and locked it) before the
handler, so the renewal aborted it and the handler ran again. The row is read last now: a
handler whose transaction holds no lock yet (here it only buffers mutations, so it holds
none on the emulator either, which locks the whole database for the first read or
statement) commits on its first try, from the record as the renewal left it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tasklease.testing.contract_support import EXPIRED, LEASE, T0, claim_request
from tasklease.worker.core.records import RunStatus, Verdict
from tasklease.worker.stores import SpannerStore
from tests.support.spanner_effects import effects, store_with_effects

pytestmark = pytest.mark.service

RENEWED_AT = T0 + LEASE / 3


@pytest.fixture
def stores(spanner_database: str) -> Iterator[tuple[SpannerStore, SpannerStore]]:
    """The worker's store, and another client of the same database renewing the lease."""
    store = store_with_effects(spanner_database)
    other = SpannerStore(spanner_database, call_timeout=5.0)
    yield store, other
    other.close()
    store.close()


def test_a_renewal_while_a_spanner_handler_runs_does_not_abort_its_transaction(
    stores: tuple[SpannerStore, SpannerStore],
) -> None:
    store, other = stores
    store.claim(claim_request(), T0)
    renewals: list[Any] = []

    def work(tx: Any) -> str:
        tx.insert("effects", ["id", "key"], [[str(uuid.uuid4()), "paid"]])
        if not renewals:
            renewals.append(other.renew("run-1", "attempt-1", LEASE, RENEWED_AT))
        return '"paid"'

    outcome = store.complete_in_transaction("run-1", "attempt-1", work, RENEWED_AT)
    assert renewals == [RENEWED_AT + LEASE]
    assert (outcome.held, outcome.tries, effects(store)) == (True, 1, 1)
    record = store.get("run-1")
    assert record is not None
    assert (record.status, record.lease_expires) == (RunStatus.COMPLETED, RENEWED_AT + LEASE)


def test_a_takeover_while_a_spanner_handler_runs_still_keeps_nothing(
    stores: tuple[SpannerStore, SpannerStore],
) -> None:
    """Fencing with the row read last: another attempt takes the run over (its lease lapsed)
    while the handler runs; the handler's transaction then finds the claim gone, and nothing
    it wrote is kept."""
    store, other = stores
    store.claim(claim_request(), T0)
    takeovers: list[Any] = []

    def work(tx: Any) -> str:
        tx.insert("effects", ["id", "key"], [[str(uuid.uuid4()), "paid"]])
        if not takeovers:
            takeovers.append(other.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED))
        return '"paid"'

    outcome = store.complete_in_transaction("run-1", "attempt-1", work, T0 + EXPIRED)
    assert takeovers[0].verdict is Verdict.CLAIMED
    assert (outcome.held, outcome.result_json, effects(store)) == (False, None, 0)
    record = store.get("run-1")
    assert record is not None
    assert (record.status, record.attempt_id) == (RunStatus.IN_PROGRESS, "attempt-2")
