"""The claim/finish rules, as pure functions of a record and the time. Stores apply them.

Keeping the rules here means every store (memory, SQLite, Firestore) decides identically,
and the rules are tested without any store at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from tasklease.worker.core import constants as c
from tasklease.worker.core import waits
from tasklease.worker.core.records import Claim, ClaimRequest, RunRecord, RunStatus, Verdict
from tasklease.worker.core.text import storable_text

# What a record takes beyond its payload, steps, continuation and result, at most: its
# identity, names, times and error (capped at MAX_ERROR_CHARS characters, 4 bytes each).
RECORD_MARGIN = 4 * c.MAX_ERROR_CHARS + 16 * 1024

# The identity field marking a replay sent with a payload the operator corrected.
REPLAY_PAYLOAD_FIELD = "replay_payload"


def is_live(record: RunRecord | None, now: datetime) -> bool:
    """A record past ``expire_at`` counts as absent, as it will once Firestore's TTL runs."""
    return record is not None and record.expire_at > now


def lease_held(record: RunRecord, now: datetime) -> bool:
    """Whether the holder of an in-progress ``record`` may still be running at ``now``.

    The lease counts as held until ``MAX_CLOCK_SKEW`` past its expiry: the expiry was written
    from the holder's clock, ``now`` is read from ours, and the two may disagree by that much.
    """
    return record.status is RunStatus.IN_PROGRESS and record.lease_expires + c.MAX_CLOCK_SKEW > now


def decide(record: RunRecord | None, now: datetime, caller: str | None = None) -> Verdict:
    """What a delivery from ``caller`` finding ``record`` at ``now`` may do."""
    if record is None or not is_live(record, now):
        return Verdict.CLAIMED
    if record.caller is not None and record.caller != caller:
        # The run belongs to another principal: it may neither run it, nor read its result.
        return Verdict.FORBIDDEN
    if record.status is RunStatus.COMPLETED:
        return Verdict.COMPLETED
    if record.status is RunStatus.FAILED:
        return Verdict.FAILED
    if record.status is RunStatus.SKIPPED:
        return Verdict.SKIPPED
    if record.status is RunStatus.CANCELLED:
        return Verdict.CANCELLED
    if lease_held(record, now):
        return Verdict.IN_PROGRESS
    if record.cancelled_at is not None:
        return Verdict.CANCELLED  # Cancelled while it ran, and its holder is gone.
    if record.status is RunStatus.WAITING and not waits.resumable(record, now):
        return Verdict.WAITING
    return Verdict.CLAIMED  # Released, resumable, or the holder's lease expired: take it over.


def claim(record: RunRecord | None, request: ClaimRequest, now: datetime) -> Claim:
    """Apply :func:`decide`; on ``CLAIMED`` return the new record the store must write.

    The fencing token carries over from any earlier record, expired or not, so a token never
    repeats for one run. The attempt count carries over from a live record only: an expired
    one counts as absent, and the run it held starts again from its first attempt.
    """
    verdict = decide(record, now, request.caller)
    if verdict is not Verdict.CLAIMED:
        assert record is not None
        return Claim(verdict, record)
    live = record if record is not None and is_live(record, now) else None
    previous_holder = (
        live.attempt_id if live is not None and live.status is RunStatus.IN_PROGRESS else None
    )
    lease_expires = now + request.lease
    claimed = RunRecord(
        run_id=request.run_id,
        kind=request.kind,
        handler=request.handler,
        status=RunStatus.IN_PROGRESS,
        attempt_id=request.attempt_id,
        fencing_token=(record.fencing_token if record else 0) + 1,
        attempts=(live.attempts if live else 0) + 1,
        lease_expires=lease_expires,
        # Never sooner than a live record's: a continuation due later relies on it.
        expire_at=max(
            now + request.retention,
            lease_expires + c.MAX_CLOCK_SKEW,
            live.expire_at if live is not None else now,
        ),
        claimed_at=now,
        # A continued or resumed run keeps its first delivery's identity (a continuation's
        # or resume task's own queue and name are not the run's).
        identity=live.identity
        if live is not None and (live.continuation_json or live.waits_json)
        else _carried(record, request.identity),
        caller=request.caller,
        # An operator's replay is written before its first delivery (replay_pending).
        replay_of=record.replay_of if record is not None else None,
        # A live run's steps and continuation carry over: a retry resumes after them.
        steps_json=live.steps_json if live is not None else None,
        continuation_json=live.continuation_json if live is not None else None,
        # So are its waits and signals, and the payload a waiting run keeps for its resume.
        waits_json=live.waits_json if live is not None else None,
        payload=live.payload if live is not None else None,
    )
    return Claim(Verdict.CLAIMED, claimed, took_over_from=previous_holder)


def _carried(record: RunRecord | None, identity: dict[str, str]) -> dict[str, str]:
    """The claim's identity, with the operator's mark of a replay sent with a corrected
    payload kept from the record written before its first delivery."""
    mark = record.identity.get(REPLAY_PAYLOAD_FIELD) if record is not None else None
    return {**identity, REPLAY_PAYLOAD_FIELD: mark} if mark else dict(identity)


def takes_manual_delivery(record: RunRecord | None, now: datetime, caller: str | None) -> bool:
    """Whether a Scheduler delivery that is either the slot's own or a retry of the slot's
    manual run ``record`` (both carry the same headers) goes to that manual run: only while
    the manual run waits for a retry (released, or its holder's lease ran out).

    Else it is the slot's: a finished manual run needs no more deliveries, and a live one must
    not turn the slot's own delivery away (Scheduler's retry_count defaults to 0). Either way
    both runs complete: a slot's delivery taken by a waiting manual run leaves the manual run's
    own retry, still due, to find it finished and run the slot. A manual run that continued
    (``continue_later``) waits for its continuation task, never for a Scheduler delivery:
    taken for it, the slot's delivery would be behind its chain, answered as a duplicate. So
    does one that has waited (``ctx.wait_for``): its own retries are resume tasks.
    """
    return (
        is_live(record, now)
        and record is not None
        and not record.continuation_json
        and not waits.has_suspended(record)
        and decide(record, now, caller) is Verdict.CLAIMED
    )


def holds(record: RunRecord | None, attempt_id: str) -> bool:
    """Whether ``attempt_id`` still holds the claim on ``record`` (attempt fencing)."""
    return (
        record is not None
        and record.attempt_id == attempt_id
        and record.status is RunStatus.IN_PROGRESS
    )


def finished_by(record: RunRecord | None, attempt_id: str, status: RunStatus | None) -> bool:
    """Whether ``record`` shows that ``attempt_id`` already finished the run with ``status``:
    a finish whose write landed although its call failed, now being retried."""
    return (
        status is not None
        and record is not None
        and record.attempt_id == attempt_id
        and record.status is status
    )


def renewed(
    record: RunRecord, lease_expires: datetime, keep_for: timedelta | None = None
) -> RunRecord:
    """The record with its lease extended, kept ``keep_for`` past the new expiry."""
    return kept(record.replace(lease_expires=lease_expires), lease_expires, keep_for)


def kept(record: RunRecord, since: datetime, keep_for: timedelta | None) -> RunRecord:
    """``record`` kept at least ``keep_for`` (the handler's retention) after ``since``, and
    never purged before its lease plus the clock-skew grace has passed: a record gone while
    its holder may still run would let a takeover skip the grace and restart the fencing
    token at 1, below the tokens downstream stores have already seen."""
    floor = max(since + (keep_for or timedelta(0)), record.lease_expires + c.MAX_CLOCK_SKEW)
    return record if record.expire_at >= floor else record.replace(expire_at=floor)


def completed(record: RunRecord, result_json: str | None, now: datetime) -> RunRecord:
    """The record of a successful run, keeping the handler's result as serialised JSON (and
    no payload: a waiting run kept it for its resume only)."""
    return record.replace(
        status=RunStatus.COMPLETED, finished_at=now, result_json=result_json, payload=None
    )


def failed(
    record: RunRecord, error: str, payload: str | None, now: datetime, *, room: int | None = None
) -> RunRecord:
    """The dead-letter record of a run that failed permanently (its payload as every store
    can keep it: a body that holds NUL or a lone surrogate is not JSON, never replayed).

    ``room``: the most the store's record may take. A payload that would not leave the rest
    of the record :data:`RECORD_MARGIN` within it is not kept, and the error says so: a
    failure that cannot be stored would run the handler again on every retry."""
    kept_payload = None if payload is None else storable_text(payload)
    if kept_payload is not None and room is not None:
        size = len(kept_payload.encode())
        rest = sum(
            len(text.encode())
            for text in (record.steps_json, record.continuation_json, record.result_json)
            if text is not None
        )
        if size + rest + RECORD_MARGIN > room:
            note = f" [the payload, {size} bytes, was not kept: the record holds {room}]"
            error = cap_text(error, c.MAX_ERROR_CHARS - len(note)) + note
            kept_payload = None
    return record.replace(
        status=RunStatus.FAILED, finished_at=now, error=cap_text(error), payload=kept_payload
    )


def continued(
    record: RunRecord, continuation_json: str, now: datetime, keep_for: timedelta | None = None
) -> RunRecord:
    """The record after a delivery ended with ``ctx.continue_later``: released for the
    continuation's delivery, with its state, no error. ``attempts`` starts again: each
    delivery of a chain is allowed ``max_attempts`` (the fencing token keeps growing).

    The delivery's steps are dropped: it is final (every later delivery of it is answered
    as a duplicate, none replays them), and a chain of any length keeps to the per-run cap.
    The next delivery starts with no steps and what ``state`` carries.

    The record is kept ``keep_for`` (the handler's retention) past the moment the
    continuation is due (``now`` plus its delay), not past ``now``: it holds the run's state,
    and a continuation delayed past a retention counted from ``now`` would find it expired.
    Each delivery attempt of the continuation that reaches the worker keeps it ``keep_for``
    longer again (its claim, a release): the continuation's retries need only reach the
    worker within the retention of each other, as every task's retries do."""
    continued_record = record.replace(
        status=RunStatus.RELEASED,
        lease_expires=now,
        error=None,
        attempts=0,
        continuation_json=continuation_json,
        steps_json=None,
    )
    return kept(continued_record, continuation_due(continuation_json, now), keep_for)


def continuation_due(continuation_json: str, now: datetime) -> datetime:
    """When the continuation recorded at ``now`` as ``continuation_json`` is due: ``now``
    plus its delay."""
    delay = float(json.loads(continuation_json).get("delay", 0.0))
    return now + timedelta(seconds=max(delay, 0.0))


def waiting(
    record: RunRecord,
    wait: waits.Wait | None,
    payload: str | None,
    now: datetime,
    keep_for: timedelta | None = None,
) -> RunRecord:
    """The record after a delivery ended in ``ctx.wait_for``: waiting on ``wait`` (None:
    the one recorded), its steps kept (the resumed delivery replays them), its signals kept,
    with the task's ``payload`` (the resume task carries none). ``attempts`` starts again,
    as after a continuation: each resumed delivery is allowed ``max_attempts``. The record
    is kept ``keep_for`` past the wait's deadline, so its timeout finds it."""
    written = record.replace(
        status=RunStatus.WAITING,
        lease_expires=now,
        error=None,
        attempts=0,
        waits_json=record.waits_json if wait is None else waits.suspended(record, wait),
        payload=payload,
    )
    wait = waits.waits_of(written).wait
    due = now if wait is None or wait.deadline is None else max(now, wait.deadline)
    return kept(written, due, keep_for)


def released(record: RunRecord, error: str, now: datetime) -> RunRecord:
    """The record of a retryable failure: claimable again at once by the next delivery."""
    return record.replace(status=RunStatus.RELEASED, lease_expires=now, error=cap_text(error))


def skipped(record: RunRecord, held_by: str, lock: str, now: datetime) -> RunRecord:
    """The record of an exclusive job's run that found ``lock`` held by run ``held_by``: kept,
    so a person can list skipped runs and see which run held the job, and so duplicates of it
    are answered without running."""
    details = json.dumps({"held_by": held_by, "lock": lock}, sort_keys=True, separators=(",", ":"))
    return record.replace(
        status=RunStatus.SKIPPED,
        finished_at=now,
        result_json=details,
        error=f"skipped: {lock} was held by run {held_by}",
    )


def yielded(record: RunRecord, reason: str, now: datetime) -> RunRecord:
    """The record of a claim given back unused because its lock was busy: released, with the
    attempt not counted (``max_attempts`` counts executions, not waits for a lock). The
    fencing token keeps its increase: tokens must never repeat, gaps are harmless."""
    return released(record, reason, now).replace(attempts=record.attempts - 1)


def cap_text(text: str, limit: int = c.MAX_ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying so when cut, and storable
    (:func:`~tasklease.worker.core.text.storable_text`): a finish that cannot be stored would
    leave the run to be executed again."""
    text = storable_text(text)
    if len(text) <= limit:
        return text
    marker = f"... [cut: {len(text)} characters, {limit} kept]"
    return text[: limit - len(marker)] + marker


DROPPED_RESULT_KEY = "tasklease_result_dropped"  # The note's one key (see serialize_result).


def serialize_result(result: Any, limit: int = c.MAX_RESULT_BYTES) -> str | None:
    """The handler's result as the JSON text stored and answered; None for None.

    A result over ``limit`` bytes is replaced by a note saying so. Raises ``ValueError`` when
    JSON cannot encode it (NaN, sets, objects, ...). Keys keep the handler's order: sorting
    would refuse mixed key types (``{1: "one", "total": 1}``) that JSON encodes, and the bytes
    are stored once, so every answer carries the same ones anyway.
    """
    if result is None:
        return None
    try:
        encoded = json.dumps(result, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"the handler's result is not JSON-serialisable: {exc}") from None
    if len(encoded.encode()) > limit:
        note = {DROPPED_RESULT_KEY: f"{len(encoded)} bytes of JSON, over {limit}"}
        return json.dumps(note, sort_keys=True, separators=(",", ":"))
    return encoded


# --- Operator actions: `tasklease runs release` and `runs replay` ----------------


class ReleaseOutcome(StrEnum):
    """What an operator's release of a run decided."""

    RELEASED = "released"  # Given back: the next delivery runs it; the old holder is fenced.
    LEASE_LIVE = "lease_live"  # Refused: the holder may still be running (use force).
    ALREADY_RELEASED = "already_released"  # Nothing to do.
    FINISHED = "finished"  # Completed, failed or skipped: nothing holds it (replay instead).
    MISSING = "missing"  # No such run (or past its retention).
    HOLDER_CHANGED = "holder_changed"  # Refused: not the attempt the operator named holds it.


@dataclass(frozen=True)
class OperatorRelease:
    """The decision, the record as it stands afterwards, and until when a refused lease runs."""

    outcome: ReleaseOutcome
    record: RunRecord | None
    forced: bool = False  # Released although the holder's lease was live.
    live_until: datetime | None = None


def operator_release(
    record: RunRecord | None,
    now: datetime,
    attempt_id: str,
    force: bool = False,
    holder: tuple[str | None, int | None] = (None, None),
) -> OperatorRelease:
    """An operator gives back the claim on ``record`` at ``now``.

    A live lease is refused unless ``force``. A release writes a new ``attempt_id`` (the
    operator's, single use) and a higher fencing token, so the old holder's renew and finish,
    which need its own attempt to hold the claim, are refused from then on. ``holder``, the
    attempt id and fencing token the operator saw (None: not checked), must still hold the
    claim: a retry that took the run over since is never the one released.
    """
    if record is None or not is_live(record, now):
        return OperatorRelease(ReleaseOutcome.MISSING, record)
    if record.status is RunStatus.RELEASED:
        return OperatorRelease(ReleaseOutcome.ALREADY_RELEASED, record)
    if record.status is not RunStatus.IN_PROGRESS:
        return OperatorRelease(ReleaseOutcome.FINISHED, record)
    live_until = record.lease_expires + c.MAX_CLOCK_SKEW
    live = lease_held(record, now)
    seen_attempt, seen_token = holder
    if (seen_attempt is not None and seen_attempt != record.attempt_id) or (
        seen_token is not None and seen_token != record.fencing_token
    ):
        return OperatorRelease(ReleaseOutcome.HOLDER_CHANGED, record, live_until=live_until)
    if live and not force:
        return OperatorRelease(ReleaseOutcome.LEASE_LIVE, record, live_until=live_until)
    note = (
        f"released by an operator while attempt {record.attempt_id}'s lease was live "
        f"(until {live_until.isoformat()})"
        if live
        else f"released by an operator: attempt {record.attempt_id}'s lease had expired"
    )
    written = record.replace(
        status=RunStatus.RELEASED,
        attempt_id=attempt_id,
        fencing_token=record.fencing_token + 1,
        lease_expires=now,
        error=cap_text(note if record.error is None else f"{note}; before: {record.error}"),
    )
    return OperatorRelease(ReleaseOutcome.RELEASED, written, forced=live, live_until=live_until)


def replay_refusal(record: RunRecord | None, now: datetime) -> str | None:
    """Why ``record`` cannot be replayed, or None when it can (a failed task with a JSON
    payload)."""
    if record is None or not is_live(record, now):
        return "no such run"
    if record.status is not RunStatus.FAILED:
        return f"only failed (dead-letter) runs are replayed; this one is {record.status.value}"
    if record.kind != "task":
        return "only task runs are replayed; run a scheduled job with `gcloud scheduler jobs run`"
    if record.payload is None:
        return "the run kept no payload to replay"
    try:
        json.loads(record.payload)
    except ValueError:
        return "the stored payload is not JSON (the run failed on it): it cannot be re-sent"
    return None


def replay_pending(
    original: RunRecord,
    run_id: str,
    identity: dict[str, str],
    now: datetime,
    retention: timedelta = c.DEFAULT_RETENTION,
) -> RunRecord:
    """The record of a replay written before its first delivery: released (claimable at
    once), no attempt yet, linked to ``original``. The first claim keeps the link."""
    return RunRecord(
        run_id=run_id,
        kind=original.kind,
        handler=original.handler,
        status=RunStatus.RELEASED,
        attempt_id="replay-pending",
        fencing_token=0,
        attempts=0,
        lease_expires=now,
        expire_at=now + retention,
        claimed_at=now,
        identity=dict(identity),
        error="waiting for the replay's first delivery",
        replay_of=original.run_id,
    )
