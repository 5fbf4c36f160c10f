"""The claim/finish rules, as pure functions of a record and the time. Stores apply them.

Keeping the rules here means every store (memory, SQLite, Firestore) decides identically,
and the rules are tested without any store at all.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from worker import constants as c
from worker.records import Claim, ClaimRequest, RunRecord, RunStatus, Verdict


def is_live(record: RunRecord | None, now: datetime) -> bool:
    """A record past ``expire_at`` counts as absent, as it will once Firestore's TTL runs."""
    return record is not None and record.expire_at > now


def decide(record: RunRecord | None, now: datetime) -> Verdict:
    """What a delivery finding ``record`` at ``now`` may do."""
    if record is None or not is_live(record, now):
        return Verdict.CLAIMED
    if record.status is RunStatus.COMPLETED:
        return Verdict.COMPLETED
    if record.status is RunStatus.FAILED:
        return Verdict.FAILED
    if record.status is RunStatus.IN_PROGRESS and record.lease_expires > now:
        return Verdict.IN_PROGRESS
    return Verdict.CLAIMED  # Released, or the holder's lease expired: take it over.


def claim(record: RunRecord | None, request: ClaimRequest, now: datetime) -> Claim:
    """Apply :func:`decide`; on ``CLAIMED`` return the new record the store must write.

    The fencing token and the attempt count carry over from any earlier record, expired or
    not, so a token never repeats for one run.
    """
    verdict = decide(record, now)
    if verdict is not Verdict.CLAIMED:
        assert record is not None
        return Claim(verdict, record)
    previous_holder = (
        record.attempt_id
        if record is not None and is_live(record, now) and record.status is RunStatus.IN_PROGRESS
        else None
    )
    lease_expires = now + request.lease
    claimed = RunRecord(
        run_id=request.run_id,
        kind=request.kind,
        handler=request.handler,
        status=RunStatus.IN_PROGRESS,
        attempt_id=request.attempt_id,
        fencing_token=(record.fencing_token if record else 0) + 1,
        attempts=(record.attempts if record else 0) + 1,
        lease_expires=lease_expires,
        expire_at=max(now + request.retention, lease_expires),
        claimed_at=now,
        identity=dict(request.identity),
    )
    return Claim(Verdict.CLAIMED, claimed, took_over_from=previous_holder)


def holds(record: RunRecord | None, attempt_id: str) -> bool:
    """Whether ``attempt_id`` still holds the claim on ``record`` (attempt fencing)."""
    return (
        record is not None
        and record.attempt_id == attempt_id
        and record.status is RunStatus.IN_PROGRESS
    )


def renewed(record: RunRecord, lease_expires: datetime) -> RunRecord:
    """The record with its lease extended; retention never ends before the lease."""
    return record.replace(
        lease_expires=lease_expires, expire_at=max(record.expire_at, lease_expires)
    )


def completed(record: RunRecord, result: Any, now: datetime) -> RunRecord:
    """The record of a successful run, keeping the handler's (capped) result."""
    return record.replace(status=RunStatus.COMPLETED, finished_at=now, result=cap_result(result))


def failed(record: RunRecord, error: str, payload: str | None, now: datetime) -> RunRecord:
    """The dead-letter record of a run that failed permanently."""
    return record.replace(
        status=RunStatus.FAILED, finished_at=now, error=cap_text(error), payload=payload
    )


def released(record: RunRecord, error: str, now: datetime) -> RunRecord:
    """The record of a retryable failure: claimable again at once by the next delivery."""
    return record.replace(status=RunStatus.RELEASED, lease_expires=now, error=cap_text(error))


def cap_text(text: str, limit: int = c.MAX_ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying so when cut."""
    if len(text) <= limit:
        return text
    marker = f"... [cut: {len(text)} characters, {limit} kept]"
    return text[: limit - len(marker)] + marker


def cap_result(result: Any, limit: int = c.MAX_RESULT_BYTES) -> Any:
    """The result if it serialises to at most ``limit`` bytes of JSON, else a note saying so."""
    try:
        encoded = json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return {"tasklease_result_dropped": f"not JSON-serialisable: {exc}"}
    if len(encoded.encode()) > limit:
        return {"tasklease_result_dropped": f"{len(encoded)} bytes of JSON, over {limit}"}
    return result
