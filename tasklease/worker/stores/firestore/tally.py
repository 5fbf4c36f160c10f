"""The Firestore store's delivery tally: one document per (instance, minute) in
``<collection>_tally``, its ``counts`` map keyed by an encoded (kind, handler, outcome).

A write is one atomic batch of those documents, each merged (``set(merge=True)``): the keys
written replace that instance's earlier totals, the others stay. Document ids are hashed,
so that minutes do not pile onto one key range (docs/platform-facts.md: hashed ids spread
load); the minute is a field, which the reads and the purge query, and ``expire_at`` is
a timestamp for a TTL policy (the deploy kit makes one on ``<collection>_tally``), as
nothing calls ``purge_expired`` on a deployed Firestore store.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from datetime import datetime
from typing import Any

from google.cloud import firestore

from tasklease.worker.stores.base.tally import (
    TALLY_KEPT,
    MinuteCounts,
    TallyKey,
    epoch_minute,
    from_epoch,
    merge,
    minute_of,
)
from tasklease.worker.stores.firestore.documents import FirestoreRuns, guard


def collection_of(client: Any, runs: str) -> Any:
    return client.collection(f"{runs}_tally")


def _field(key: TallyKey) -> str:
    """A map key of letters and digits only: no field path needs quoting."""
    return json.dumps([key.kind, key.handler, key.outcome]).encode().hex()


def _key(field: str) -> TallyKey:
    kind, handler, outcome = json.loads(bytes.fromhex(field))
    return TallyKey(kind, handler, outcome)


def write(
    client: Any, runs: str, instance: str, counts: MinuteCounts, call: dict[str, Any]
) -> None:
    tally = collection_of(client, runs)
    batch = client.batch()
    for minute, keyed in counts.items():
        at = epoch_minute(minute)
        document = hashlib.sha256(json.dumps([instance, at]).encode()).hexdigest()[:32]
        fields = {
            "instance": instance,
            "minute": at,
            "expire_at": from_epoch(at) + TALLY_KEPT,  # For a TTL policy (the deploy kit's).
            "counts": {_field(k): n for k, n in keyed.items()},
        }
        batch.set(tally.document(document), fields, merge=True)
    batch.commit(**call)


def read(
    client: Any, runs: str, since: datetime, timeout: float
) -> dict[datetime, Counter[TallyKey]]:
    query = collection_of(client, runs).where(
        filter=firestore.FieldFilter("minute", ">=", epoch_minute(minute_of(since)))
    )
    answer: dict[datetime, Counter[TallyKey]] = {}
    for snapshot in query.stream(timeout=timeout):
        data = snapshot.to_dict() or {}
        for field, n in (data.get("counts") or {}).items():
            merge(answer, from_epoch(int(data["minute"])), _key(field), int(n))
    return answer


def purge(client: Any, runs: str, before: datetime, call: dict[str, Any]) -> int:
    query = collection_of(client, runs).where(
        filter=firestore.FieldFilter("minute", "<", epoch_minute(before))
    )
    purged = 0
    for snapshot in query.stream(timeout=call.get("timeout")):
        snapshot.reference.delete(**call)
        purged += 1
    return purged


class FirestoreTally:
    """The tally of the Firestore store: documents beside its run collection, through the
    same client and call options as ``runs``."""

    def __init__(self, runs: FirestoreRuns) -> None:
        self.runs = runs

    def write(self, instance: str, counts: MinuteCounts) -> None:
        """:meth:`DeliveryTally.write_delivery_counts`."""
        runs = self.runs
        with guard("write delivery counts"):
            write(runs.client, runs.collection, instance, counts, runs.call_options)

    def read(self, since: datetime) -> dict[datetime, Counter[TallyKey]]:
        """:meth:`DeliveryTally.delivery_counts`."""
        runs = self.runs
        with guard("read delivery counts"):
            return read(runs.client, runs.collection, since, runs.call_timeout)

    def purge(self, before: datetime) -> int:
        """:meth:`DeliveryTally.purge_delivery_counts`."""
        runs = self.runs
        with guard("purge delivery counts"):
            return purge(runs.client, runs.collection, before, runs.call_options)
