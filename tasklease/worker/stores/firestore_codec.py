"""A run record as a Firestore document and back (field names as stored since the start)."""

from __future__ import annotations

from typing import Any

from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.stores.firestore_locks import utc as _utc


def encode_run(record: RunRecord) -> dict[str, Any]:
    return {
        "kind": record.kind,
        "handler": record.handler,
        "status": record.status.value,
        "attempt_id": record.attempt_id,
        "fencing_token": record.fencing_token,
        "attempts": record.attempts,
        "lease_expires": record.lease_expires,
        "expire_at": record.expire_at,
        "claimed_at": record.claimed_at,
        "finished_at": record.finished_at,
        "identity": dict(record.identity),
        # JSON text: Firestore maps cannot hold every JSON value (no arrays of arrays).
        "result": record.result_json,
        "error": record.error,
        "payload": record.payload,
        "caller": record.caller,
        "replay_of": record.replay_of,
        "replayed_as": record.replayed_as,
    }


def decode_run(run_id: str, data: dict[str, Any] | None) -> RunRecord:
    data = data or {}
    return RunRecord(
        run_id=run_id,
        kind=data["kind"],
        handler=data["handler"],
        status=RunStatus(data["status"]),
        attempt_id=data["attempt_id"],
        fencing_token=int(data["fencing_token"]),
        attempts=int(data["attempts"]),
        lease_expires=_utc(data["lease_expires"]),
        expire_at=_utc(data["expire_at"]),
        claimed_at=_utc(data["claimed_at"]),
        identity=dict(data.get("identity") or {}),
        finished_at=_utc(data["finished_at"]) if data.get("finished_at") else None,
        result_json=data.get("result"),
        error=data.get("error"),
        payload=data.get("payload"),
        caller=data.get("caller"),
        replay_of=data.get("replay_of"),
        replayed_as=data.get("replayed_as"),
    )
