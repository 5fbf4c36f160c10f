"""The Firestore store's lock documents (``<collection>_locks``): their fields, listing, purge.

One document per lock, its id the hashed lock name (:func:`locking.lock_id`). ``lapses_at``
is a timestamp a TTL policy may delete the document by: from then on it decides nothing, and
its fencing token is outranked by any later grant's (:func:`locking.next_token`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from google.api_core import exceptions as api
from google.cloud import firestore

from tasklease.worker.core import locking
from tasklease.worker.core.records import LockRecord
from tasklease.worker.stores.base.codec import Conversion, RecordCodec


def encode(lock: LockRecord) -> dict[str, Any]:
    # From lapses_at on, the document decides nothing: a TTL policy may delete it.
    return {**_CODEC.encode_map(lock), "lapses_at": locking.lapses_at(lock)}


def decode(name: str, data: dict[str, Any] | None) -> LockRecord:
    return _CODEC.decode_map(data or {}, name=name)


def listed(collection: Any, limit: int, timeout: float) -> list[LockRecord]:
    """Up to ``limit`` locks of ``collection``, latest start first (a single-field index)."""
    query = collection.order_by("started_at", direction=firestore.Query.DESCENDING).limit(limit)
    return [decode(snapshot.id, snapshot.to_dict()) for snapshot in query.stream(timeout=timeout)]


def purge(client: Any, collection: Any, now: datetime, call: dict[str, Any]) -> int:
    """Delete the locks of ``collection`` whose ``lapses_at`` has passed, each only in the
    version read (a grant since then makes it a live lock again)."""
    purged = 0
    lapsed = collection.where(filter=firestore.FieldFilter("lapses_at", "<=", now))
    for snapshot in lapsed.stream():
        option = client.write_option(last_update_time=snapshot.update_time)
        try:
            snapshot.reference.delete(option=option, **call)
        except (api.FailedPrecondition, api.NotFound):
            continue
        purged += 1
    return purged


def utc(moment: datetime) -> datetime:
    """A plain UTC datetime (the client returns DatetimeWithNanoseconds, microseconds kept)."""
    return datetime(
        moment.year,
        moment.month,
        moment.day,
        moment.hour,
        moment.minute,
        moment.second,
        moment.microsecond,
        tzinfo=UTC,
    )


_CODEC = RecordCodec(LockRecord, time=Conversion(decode=utc))
