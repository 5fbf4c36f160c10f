"""FirestoreStore, operators' side: a forced release fences a holder in another process."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from tasklease.testing.contract_support import LEASE
from tasklease.worker.core.decisions import ReleaseOutcome
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores import FirestoreStore
from tests.support.firestore import IGNORES_UPDATE_TIME, PROJECT, unique_collection
from tests.support.helpers import T0, claim_request


@pytest.fixture
def stores(firestore_host: str | None) -> Iterator[tuple[FirestoreStore, FirestoreStore]]:
    collection = unique_collection()
    holder = FirestoreStore.from_options(collection=collection, project=PROJECT)
    operator = FirestoreStore.from_options(collection=collection, project=PROJECT)
    yield holder, operator
    holder.close()
    operator.close()


@IGNORES_UPDATE_TIME
def test_a_forced_release_elsewhere_refuses_the_holders_remembered_writes(
    stores: tuple[FirestoreStore, FirestoreStore],
) -> None:
    holder, operator = stores
    holder.claim(claim_request(), T0)
    assert holder.renew("run-1", "attempt-1", LEASE, T0 + timedelta(seconds=1))
    # The holder now conditions its writes on the update time it remembers, without reading.
    decision = operator.operator_release("run-1", T0 + timedelta(seconds=2), force=True)
    assert decision.outcome is ReleaseOutcome.RELEASED
    later = T0 + timedelta(seconds=3)
    assert holder.renew("run-1", "attempt-1", LEASE, later) is None
    assert not holder.complete("run-1", "attempt-1", '"late"', later)
    record = operator.get("run-1")
    assert record is not None
    assert (record.status, record.fencing_token) == (RunStatus.RELEASED, 2)


def test_replay_links_and_lookups_use_the_documents_fields(
    stores: tuple[FirestoreStore, FirestoreStore],
) -> None:
    holder, operator = stores
    holder.claim(claim_request(identity={"queue": "q", "task_name": "order-9"}), T0)
    assert operator.mark_replayed("run-1", "run-2") is not None
    snapshot = holder.client.collection(holder.collection).document("run-1").get()
    document = snapshot.to_dict()
    assert document is not None and document["replayed_as"] == "run-2"
    assert [r.run_id for r in operator.find_runs(task_name="order-9")] == ["run-1"]
