"""The lock rules: exclusive jobs and per-key mutual exclusion, as pure functions.

A lock is held by one attempt of one run, under the same lease as the run: the lease keeper
renews both together, so a live run never loses its lock however long it runs. A holder that
stops renewing (crashed, cut off from the store) keeps blocking other runs until both its lease
and its safety expiry (``max_runtime``, ShedLock's lockAtMostFor) have passed; a holder still
renewing past ``max_runtime`` keeps the lock. Every change to a lock is conditional on the
attempt holding it (fencing), and every rule recognises its own earlier write by the attempt
id, so a store may re-apply a change whose write landed unseen.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from tasklease.worker import constants as c
from tasklease.worker.records import LockGrant, LockRecord, LockRequest


def job_lock_name(handler: str, project: str | None, location: str | None) -> str:
    """The lock of an exclusive scheduled handler: shared by every Scheduler job that targets
    it (two timers firing one job are the overlap the lock exists for) and manual runs."""
    return f"job/{project or ''}/{location or ''}/{handler}"


def key_lock_name(handler: str, project: str | None, location: str | None, key: str) -> str:
    """The lock of one concurrency key of a task handler."""
    return f"key/{project or ''}/{location or ''}/{handler}/{key}"


def lock_id(name: str) -> str:
    """A fixed-length hash of the lock name, for document ids (spread, never too long)."""
    return hashlib.sha256(name.encode()).hexdigest()


def busy_until(lock: LockRecord | None, run_id: str, now: datetime) -> datetime | None:
    """When ``lock`` stops keeping ``run_id`` out, if it does at ``now``; else None.

    Another attempt of the *same* run is never kept out: the run's own claim already fenced
    the earlier attempt (it takes a run over only once that attempt's lease lapsed).
    """
    if lock is None or lock.holder_run_id == run_id:
        return None
    if not lock.released:
        held_until = max(lock.lease_expires + c.MAX_CLOCK_SKEW, lock.safety_expires)
        if held_until > now:
            return held_until
    if lock.next_start_at > now:  # min_gap: too soon after the last run started.
        return lock.next_start_at
    return None


def acquire(lock: LockRecord | None, request: LockRequest, now: datetime) -> LockGrant:
    """Whether ``request`` gets the lock at ``now``; on success, the record to write."""
    if lock is not None and holds(lock, request.attempt_id):
        return LockGrant(True, lock)  # Our own acquisition, landed before: nothing to write.
    free_at = busy_until(lock, request.run_id, now)
    if free_at is not None:
        assert lock is not None
        return LockGrant(False, lock, free_at=free_at)
    took_over_from = (
        lock.holder_run_id
        if lock is not None and not lock.released and lock.holder_run_id != request.run_id
        else None
    )
    lease_expires = now + request.lease
    acquired = LockRecord(
        name=request.name,
        holder_run_id=request.run_id,
        holder_attempt_id=request.attempt_id,
        fencing_token=(lock.fencing_token if lock else 0) + 1,
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
    """From this moment the record decides nothing any more: a store may delete it."""
    return max(lock.lease_expires + c.MAX_CLOCK_SKEW, lock.safety_expires, lock.next_start_at)
