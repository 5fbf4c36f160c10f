"""A run record as a Firestore document and back (field names as stored since the start).

The document holds every field but ``run_id`` (its id is the hashed run id) under the field's
own name, but for :data:`RENAMES`.
"""

from __future__ import annotations

from typing import Any

from tasklease.worker.core.records import RunRecord
from tasklease.worker.stores.base.codec import Conversion, RecordCodec
from tasklease.worker.stores.firestore.locks import utc as _utc

# JSON text under "result": Firestore maps cannot hold every JSON value (no arrays of arrays).
RENAMES = {"result_json": "result"}
_CODEC = RecordCodec(
    RunRecord,
    time=Conversion(decode=_utc),
    mapping=Conversion(encode=dict, decode=lambda stored: dict(stored or {})),
    renames=RENAMES,
    skip=["run_id"],
)


def encode_run(record: RunRecord) -> dict[str, Any]:
    return _CODEC.encode_map(record)


def decode_run(run_id: str, data: dict[str, Any] | None) -> RunRecord:
    return _CODEC.decode_map(data or {}, run_id=run_id)
