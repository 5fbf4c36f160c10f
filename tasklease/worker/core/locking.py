"""The lock rules: exclusive jobs and per-key mutual exclusion, as pure functions.

A lock is held by one attempt of one run, under the same lease as the run: the lease keeper
renews both together, so a live run never loses its lock however long it runs. A holder that
stops renewing (crashed, cut off from the store) keeps blocking other runs until both its lease
and its safety expiry (``max_runtime``, ShedLock's lockAtMostFor) have passed; a holder still
renewing past ``max_runtime`` keeps the lock. A holder whose run is recorded as ended by that
very attempt (its release of the lock was lost) holds nothing: the next run takes the lock.
Every change to a lock is conditional on the attempt holding it (fencing), and every rule
recognises its own earlier write by the attempt id, so a store may re-apply a change whose
write landed unseen.

Fencing tokens grow for the life of a key, whatever a store deletes: see :func:`next_token`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from tasklease.worker.core import constants as c
from tasklease.worker.core.records import LockGrant, LockRecord, LockRequest, RunRecord, RunStatus
from tasklease.worker.core.text import storable_text

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def job_lock_name(handler: str, project: str | None, location: str | None) -> str:
    """The lock of an exclusive scheduled handler: shared by every Scheduler job that targets
    it (two timers firing one job are the overlap the lock exists for) and manual runs."""
    return f"job/{project or ''}/{location or ''}/{handler}"


def key_lock_name(handler: str, project: str | None, location: str | None, key: str) -> str:
    """The lock of one concurrency key of a task handler, its name storable: a key from a
    payload may hold NUL or a lone surrogate (two keys that differ only there may share a
    lock, which only serialises them)."""
    return f"key/{project or ''}/{location or ''}/{handler}/{storable_text(key)}"


def lock_id(name: str) -> str:
    """A fixed-length hash of the lock name, for document ids (spread, never too long)."""
    return hashlib.sha256(name.encode()).hexdigest()


def token_floor(now: datetime) -> int:
    """The least fencing token a grant at ``now`` carries: ``now`` in microseconds since the
    epoch (below 2**53 until the year 2255, so exact in JSON and JavaScript too)."""
    delta = now - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def token_time(token: int) -> datetime:
    """The moment a fencing token stands for (its :func:`token_floor`)."""
    return _EPOCH + timedelta(microseconds=token)


def next_token(lock: LockRecord | None, now: datetime) -> int:
    """The fencing token of a grant at ``now``: one more than the stored lock's, and at least
    ``now`` in microseconds.

    While the record is stored, tokens grow by the first rule whatever the clocks say. Once
    it is gone (purged, deleted by a Firestore TTL policy), nothing remembers the last token;
    the second rule outranks it, because a record is never deleted before
    ``c.LOCK_TOKEN_MARGIN`` past the moment its own token stands for (:func:`lapses_at`), and
    a grant after the deletion reads a clock at most that far behind. So storage stays
    bounded (a key's record lives only while it decides something) and no counter document
    is written by every grant of every key (Firestore sustains about one write a second per
    document).
    """
    return max((lock.fencing_token if lock else 0) + 1, token_floor(now))


def holder_finished(lock: LockRecord, holder_run: RunRecord | None) -> bool:
    """Whether ``holder_run`` (the record of the lock holder's run) shows the holding attempt
    ended that run itself: completed, failed, released or skipped, written by that attempt.
    Attempt ids are single use, so that attempt runs no more and never holds again; its lock
    is free (its release was lost, or it never got to release)."""
    return (
        holder_run is not None
        and holder_run.run_id == lock.holder_run_id
        and holder_run.attempt_id == lock.holder_attempt_id
        and holder_run.status is not RunStatus.IN_PROGRESS
    )


def needs_holder(lock: LockRecord | None, run_id: str, now: datetime) -> bool:
    """Whether :func:`acquire` needs the record of the lock holder's run to decide for
    ``run_id`` at ``now``: a store reads it (in the same atomic change) only then. For a lock
    last held by ``run_id`` itself, that record is the requester's own: it shows whether the
    requester still holds its run's claim."""
    if lock is None:
        return False
    if lock.holder_run_id == run_id:
        return True
    return not lock.released and _held_until(lock) > now


def busy_until(
    lock: LockRecord | None, run_id: str, now: datetime, holder_run: RunRecord | None = None
) -> datetime | None:
    """When ``lock`` stops keeping ``run_id`` out, if it does at ``now``; else None.

    Another attempt of the *same* run is never kept out here: the run's own claim fenced the
    earlier attempt (it takes a run over only once that attempt's lease lapsed), and
    :func:`acquire` refuses a requester whose claim has passed on (:func:`claim_passed_on`).
    ``holder_run`` is the holder's run record, when the store read it (:func:`needs_holder`).
    """
    if lock is None or lock.holder_run_id == run_id:
        return None
    return kept_out_until(lock, holder_run, now)


def claim_passed_on(lock: LockRecord | None, request: LockRequest, run: RunRecord | None) -> bool:
    """Whether ``run``, the record of the run ``request`` asks for and whose lock it last
    was, shows its claim held by another attempt than the requester's. The requester is stale:
    its claim was taken over while its request was on its way, or while it stalled between
    its claim and this request. Granted the lock, it would take it from the attempt now
    holding the run and, giving it back, free it for another run while that attempt works.
    Attempt ids are single use, so once true this stays true: reading ``run`` beside the
    lock's compare-and-set is enough."""
    return (
        lock is not None
        and lock.holder_run_id == request.run_id
        and run is not None
        and run.run_id == request.run_id
        and run.attempt_id != request.attempt_id
    )


def _held_until(lock: LockRecord) -> datetime:
    return max(lock.lease_expires + c.MAX_CLOCK_SKEW, lock.safety_expires)


def kept_out_until(
    lock: LockRecord, holder_run: RunRecord | None, now: datetime
) -> datetime | None:
    """Until when ``lock`` keeps any other run out at ``now`` (None: it does not)."""
    if not lock.released and not holder_finished(lock, holder_run):
        held_until = _held_until(lock)
        if held_until > now:
            return held_until
    if lock.next_start_at > now:  # min_gap: too soon after the last run started.
        return lock.next_start_at
    return None


def acquire(
    lock: LockRecord | None,
    request: LockRequest,
    now: datetime,
    holder_run: RunRecord | None = None,
) -> LockGrant:
    """Whether ``request`` gets the lock at ``now``; on success, the record to write.
    ``holder_run``: the holder's run record, when :func:`needs_holder` asked for it."""
    if lock is not None and holds(lock, request.attempt_id):
        return LockGrant(True, lock)  # Our own acquisition, landed before: nothing to write.
    if claim_passed_on(lock, request, holder_run):
        assert lock is not None
        return LockGrant(False, lock, free_at=max(_held_until(lock), now))
    free_at = busy_until(lock, request.run_id, now, holder_run)
    if free_at is not None:
        assert lock is not None
        return LockGrant(False, lock, free_at=free_at)
    took_over_from = (
        lock.holder_run_id
        if lock is not None
        and not lock.released
        and lock.holder_run_id != request.run_id
        and not holder_finished(lock, holder_run)
        else None
    )
    lease_expires = now + request.lease
    acquired = LockRecord(
        name=request.name,
        holder_run_id=request.run_id,
        holder_attempt_id=request.attempt_id,
        fencing_token=next_token(lock, now),
        started_at=now,
        lease_expires=lease_expires,
        safety_expires=now + request.max_runtime if request.max_runtime else now,
        next_start_at=now + request.min_gap,
    )
    return LockGrant(True, acquired, took_over_from=took_over_from)


def holds(lock: LockRecord | None, attempt_id: str) -> bool:
    """Whether ``attempt_id`` holds ``lock`` (and has not released it)."""
    return lock is not None and lock.holder_attempt_id == attempt_id and not lock.released


def renewed(lock: LockRecord, lease: timedelta, now: datetime) -> LockRecord:
    """The lock with its holder's lease extended to ``now + lease``."""
    return lock.replace(lease_expires=max(lock.lease_expires, now + lease))


def released(lock: LockRecord, now: datetime) -> LockRecord:
    """The lock given back by its holder: free at once, except for ``min_gap``. The safety
    expiry is lifted too: it exists only for a holder that could not release."""
    return lock.replace(released_at=now, lease_expires=now, safety_expires=now)


def released_by(lock: LockRecord | None, attempt_id: str) -> bool:
    """Whether ``attempt_id`` released ``lock`` itself (a release retried after it landed)."""
    return lock is not None and lock.holder_attempt_id == attempt_id and lock.released


def lapses_at(lock: LockRecord) -> datetime:
    """From this moment the record decides nothing any more: a store may delete it. Its
    token is outranked by any later grant's from then on too (:func:`next_token`)."""
    return max(
        lock.lease_expires + c.MAX_CLOCK_SKEW,
        lock.safety_expires,
        lock.next_start_at,
        token_time(lock.fencing_token) + c.LOCK_TOKEN_MARGIN,
    )


# --- Operators: `tasklease locks list` and `tasklease locks release` -------------------------


class LockState(StrEnum):
    """What a stored lock does at a moment, for operators."""

    HELD = "held"  # Its holder's lease is live: the holder is running.
    SILENT = "silent"  # Its holder stopped renewing; kept until max_runtime (may run unheard).
    GAP = "min_gap"  # No holder; no run starts before min_gap after the last start.
    FREE = "free"  # Decides nothing: the next run takes it.


def live_until(lock: LockRecord, holder_run: RunRecord | None, now: datetime) -> datetime | None:
    """Until when the holder may be running and renewing, if it may at ``now``; else None."""
    if lock.released or holder_finished(lock, holder_run):
        return None
    until = lock.lease_expires + c.MAX_CLOCK_SKEW
    return until if until > now else None


def state(lock: LockRecord, holder_run: RunRecord | None, now: datetime) -> LockState:
    """The lock's :class:`LockState` at ``now``, given its holder's run record."""
    if live_until(lock, holder_run, now) is not None:
        return LockState.HELD
    kept_until = kept_out_until(lock, holder_run, now)
    if kept_until is None:
        return LockState.FREE
    return LockState.GAP if kept_until == lock.next_start_at else LockState.SILENT


class LockReleaseOutcome(StrEnum):
    """What an operator's release of a lock decided."""

    RELEASED = "released"  # Free now; a live holder's renewals are refused from now on.
    HOLDER_LIVE = "holder_live"  # Refused: the holder is running (use force).
    ALREADY_FREE = "already_free"  # Nothing keeps a run out: nothing to do.
    MISSING = "missing"  # No such lock (never taken, or purged).


@dataclass(frozen=True)
class OperatorLockRelease:
    """The decision, the lock as it stands afterwards, and until when a live holder's lease
    runs (refused, or released with ``forced``)."""

    outcome: LockReleaseOutcome
    lock: LockRecord | None
    forced: bool = False
    live_until: datetime | None = None


def operator_release(
    lock: LockRecord | None, holder_run: RunRecord | None, now: datetime, force: bool = False
) -> OperatorLockRelease:
    """An operator frees ``lock`` at ``now``: its holder's hold, safety expiry and ``min_gap``.

    Refused while the holder's lease is live unless ``force``: that holder is running. A
    holder that stopped renewing (kept only by ``max_runtime``) or whose run ended needs no
    force. The holder stays named, so its own late release still succeeds, but its renewals
    are refused: a forced-out holder loses its lease (``ctx.lease_lost``).
    """
    if lock is None:
        return OperatorLockRelease(LockReleaseOutcome.MISSING, None)
    if kept_out_until(lock, holder_run, now) is None:
        return OperatorLockRelease(LockReleaseOutcome.ALREADY_FREE, lock)
    until = live_until(lock, holder_run, now)
    if until is not None and not force:
        return OperatorLockRelease(LockReleaseOutcome.HOLDER_LIVE, lock, live_until=until)
    written = lock.replace(
        released_at=lock.released_at or now,
        lease_expires=min(lock.lease_expires, now),
        safety_expires=min(lock.safety_expires, now),
        next_start_at=min(lock.next_start_at, now),
    )
    return OperatorLockRelease(
        LockReleaseOutcome.RELEASED, written, forced=until is not None, live_until=until
    )
