"""The lease store contract: one base class, every backend a subclass."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, ClassVar, TypeVar

from tasklease.worker import decisions, locking
from tasklease.worker.identity import parse_rfc3339
from tasklease.worker.records import (
    Claim,
    ClaimRequest,
    LockGrant,
    LockRecord,
    LockRequest,
    RunRecord,
    RunStatus,
)

if TYPE_CHECKING:
    from tasklease.worker.queries import Position, RunFilter, RunPage

_T = TypeVar("_T")

Moment = datetime | Callable[[], datetime]
"""A time, or a clock that a store reads as late as it can: inside its atomic change, after any
wait for a lock, so that a lease is never computed from a time read before a long wait."""

Update = Callable[[RunRecord, datetime], RunRecord]
"""Given the record an attempt holds and the time, returns the record to write."""

Change = Callable[[RunRecord | None], tuple[RunRecord | None, _T]]
"""Given the stored record (or None), returns the record to write (None: write nothing) and a
value for the caller."""


def _instant(text: str | None) -> datetime | None:
    return parse_rfc3339(text) if text else None


RunReader = Callable[[str], RunRecord | None]
"""Reads a run's record (expired or not) as part of a lock's atomic change."""

LockChange = Callable[[LockRecord | None, RunReader], tuple[LockRecord | None, _T]]
"""Given the stored lock (or None) and a reader of runs, returns the lock to write (None: write
nothing) and a value for the caller."""


def resolve(now: Moment) -> datetime:
    """The time ``now`` stands for: itself, or the clock's reading at this moment."""
    return now() if callable(now) else now


class LeaseStore(ABC):
    """Keeps one :class:`~tasklease.worker.records.RunRecord` per run and changes it atomically.

    A backend implements three primitives:

    - :meth:`_read_modify_write`: read one record and apply a change to it atomically, so that
      two concurrent changes to one run never both see the same old record. This carries every
      rule: claim, renew, complete, fail and release are all built on it here, with the rules
      themselves in :mod:`tasklease.worker.decisions`.
    - :meth:`get` and :meth:`list_runs`: plain reads.
    - :meth:`purge_expired`: delete records past ``expire_at`` (and locks that decide nothing
      any more, :func:`tasklease.worker.locking.lapses_at`).
    - for exclusive jobs and concurrency keys, :meth:`_read_modify_write_lock`, :meth:`get_lock`
      and :meth:`list_locks`: the same for :class:`~tasklease.worker.records.LockRecord`, kept
      apart from the runs (a table, a collection). Acquire, renew and release are built on
      them here, with the rules in :mod:`tasklease.worker.locking`. A lock change may read the
      holder's run record: a holder whose own attempt recorded its run's end holds nothing,
      so a release that was lost never blocks the next run. SQLite and memory read it in the
      same transaction; Firestore reads it beside the lock's compare-and-set, which is enough
      because "this attempt ended its run" never becomes false (attempt ids are single use).

    Lock fencing tokens grow for the life of a key although lapsed locks are deleted (purged,
    or by a TTL policy on ``lapses_at``): a token is at least its grant's time in
    microseconds, and a lock is deleted only ``LOCK_TOKEN_MARGIN`` after the time its token
    stands for (:func:`tasklease.worker.locking.next_token`). Keeping every key's record, or a
    store-wide counter, would do it too, but the first grows with every key ever used (one
    per account, say) and the second makes every grant write one document, which Firestore
    sustains at about one write a second.

    A backend may override :meth:`claim` and :meth:`_if_held` (which renew, complete, fail
    and release go through) with faster equivalents, as the Firestore store does with
    single-document preconditions, as long as the contract tests still pass. Either must
    read a :data:`Moment` as late as it can, and must recognise its own earlier write when a
    call that landed is retried (the stored attempt id says whose write it is).

    Concurrency: every method may be called from many threads, and a store built from the same
    configuration in several processes must behave as one store. Every method raises
    :class:`~tasklease.worker.errors.StoreUnavailable` (and nothing else) when the backend
    fails; when it does, nothing was changed or the change is indistinguishable from one that
    was not made.

    ``shared_across_instances`` says whether every instance of a service reaching the same
    configuration sees the same records (a database service does; a file or process memory
    does not): :func:`~tasklease.worker.stores.check_store_is_shared` refuses the latter on
    Cloud Run.
    """

    shared_across_instances: ClassVar[bool] = True

    @abstractmethod
    def _read_modify_write(self, run_id: str, change: Change[_T]) -> _T:
        """Apply ``change`` to the record of ``run_id`` atomically; return its value."""

    @abstractmethod
    def get(self, run_id: str) -> RunRecord | None:
        """The stored record of ``run_id``, expired or not, or None."""

    @abstractmethod
    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        """Up to ``limit`` records, newest claim first, optionally only those in ``status``."""

    @abstractmethod
    def purge_expired(self, now: datetime) -> int:
        """Delete every record whose ``expire_at`` is at or before ``now``; return how many."""

    def _read_modify_write_lock(self, name: str, change: LockChange[_T]) -> _T:
        """Apply ``change`` to the lock called ``name`` atomically; return its value."""
        raise NotImplementedError(f"{type(self).__name__} keeps no locks")

    def get_lock(self, name: str) -> LockRecord | None:
        """The stored lock called ``name``, or None."""
        raise NotImplementedError(f"{type(self).__name__} keeps no locks")

    def list_locks(self, limit: int = 100) -> list[LockRecord]:
        """Up to ``limit`` stored locks, latest start first (lapsed ones until purged)."""
        raise NotImplementedError(f"{type(self).__name__} cannot list locks")

    def acquire_lock(self, request: LockRequest, now: Moment) -> LockGrant:
        """Take the lock for ``request.attempt_id`` unless another run holds it (or held it
        less than its ``min_gap`` ago). Call it only while holding the run's claim."""

        def change(lock: LockRecord | None, read: RunReader) -> tuple[LockRecord | None, LockGrant]:
            at = resolve(now)
            holder = None
            if lock is not None and locking.needs_holder(lock, request.run_id, at):
                holder = read(lock.holder_run_id)
            grant = locking.acquire(lock, request, at, holder)
            return (grant.lock if grant.lock is not lock else None), grant

        return self._read_modify_write_lock(request.name, change)

    def renew_lock(
        self, name: str, attempt_id: str, lease: timedelta, now: Moment
    ) -> datetime | None:
        """Extend the holder's lease on the lock; None if ``attempt_id`` no longer holds it."""

        def change(
            lock: LockRecord | None, _: RunReader
        ) -> tuple[LockRecord | None, datetime | None]:
            if lock is None or not locking.holds(lock, attempt_id):
                return None, None
            written = locking.renewed(lock, lease, resolve(now))
            return written, written.lease_expires

        return self._read_modify_write_lock(name, change)

    def release_lock(self, name: str, attempt_id: str, now: Moment) -> bool:
        """Give the lock back if ``attempt_id`` holds it (fenced: a stale holder's release
        changes nothing and answers False). True again for a release retried after it landed."""

        def change(lock: LockRecord | None, _: RunReader) -> tuple[LockRecord | None, bool]:
            if locking.released_by(lock, attempt_id):
                return None, True
            if lock is None or not locking.holds(lock, attempt_id):
                return None, False
            return locking.released(lock, resolve(now)), True

        return self._read_modify_write_lock(name, change)

    def operator_release_lock(
        self, name: str, now: Moment, *, force: bool = False
    ) -> locking.OperatorLockRelease:
        """An operator frees the lock (see :func:`locking.operator_release`): refused while its
        holder's lease is live unless ``force``; a forced-out holder's renewals are refused."""

        def change(
            lock: LockRecord | None, read: RunReader
        ) -> tuple[LockRecord | None, locking.OperatorLockRelease]:
            holder = read(lock.holder_run_id) if lock is not None and not lock.released else None
            decision = locking.operator_release(lock, holder, resolve(now), force)
            released = decision.outcome is locking.LockReleaseOutcome.RELEASED
            return (decision.lock if released else None), decision

        return self._read_modify_write_lock(name, change)

    def close(self) -> None:  # noqa: B027 - optional hook, most stores hold nothing to close.
        """Release connections. The store must not be used afterwards."""

    def claim(self, request: ClaimRequest, now: Moment) -> Claim:
        """Claim the run for ``request.attempt_id`` unless it is done or leased by another.

        ``now`` is read inside the atomic change, after any wait for a lock, so a claim that
        waited is not written with a lease the wait already used up.
        """

        def change(record: RunRecord | None) -> tuple[RunRecord | None, Claim]:
            outcome = decisions.claim(record, request, resolve(now))
            return (outcome.record if outcome.record is not record else None), outcome

        return self._read_modify_write(request.run_id, change)

    def renew(
        self,
        run_id: str,
        attempt_id: str,
        lease: timedelta,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> datetime | None:
        """Extend the lease to ``now + lease`` if ``attempt_id`` still holds the claim, and
        keep the record at least ``keep_for`` (the handler's retention) past that.

        Returns the new expiry, or None if the claim is gone.
        """
        record = self._if_held(
            run_id,
            attempt_id,
            lambda r, at: decisions.renewed(r, at + lease, keep_for),
            now,
            None,
        )
        return None if record is None else record.lease_expires

    def complete(
        self,
        run_id: str,
        attempt_id: str,
        result_json: str | None,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> bool:
        """Record success with the serialised result if ``attempt_id`` still holds the claim.

        Every finish keeps the record at least ``keep_for`` (the handler's retention) after it,
        so a run that outlived its retention still answers the duplicates that follow it.
        """
        return self._finish(
            run_id,
            attempt_id,
            lambda r, at: decisions.completed(r, result_json, at),
            now,
            RunStatus.COMPLETED,
            keep_for=keep_for,
        )

    def fail(
        self,
        run_id: str,
        attempt_id: str,
        error: str,
        now: Moment,
        payload: str | None = None,
        *,
        keep_for: timedelta | None = None,
    ) -> bool:
        """Record a permanent failure (a dead letter) if ``attempt_id`` still holds the claim.

        ``payload`` is kept on the record so the run can be inspected and replayed.
        """
        return self._finish(
            run_id,
            attempt_id,
            lambda r, at: decisions.failed(r, error, payload, at),
            now,
            RunStatus.FAILED,
            keep_for=keep_for,
        )

    def release(
        self,
        run_id: str,
        attempt_id: str,
        error: str,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> bool:
        """Give the claim back after a retryable failure, so the next delivery runs at once.

        The record stays (released) rather than being deleted, so the fencing token and the
        attempt count keep growing across attempts.
        """
        return self._finish(
            run_id,
            attempt_id,
            lambda r, at: decisions.released(r, error, at),
            now,
            RunStatus.RELEASED,
            keep_for=keep_for,
        )

    def skip(self, run_id: str, attempt_id: str, held_by: str, lock: str, now: Moment) -> bool:
        """Record the run as skipped (its job's ``lock`` held by run ``held_by``), if
        ``attempt_id`` still holds the claim. Duplicates of it are then answered as skipped."""
        return self._finish(
            run_id,
            attempt_id,
            lambda r, at: decisions.skipped(r, held_by, lock, at),
            now,
            RunStatus.SKIPPED,
        )

    def yield_claim(self, run_id: str, attempt_id: str, reason: str, now: Moment) -> bool:
        """Give an unused claim back (its lock was busy) without counting the attempt."""
        return self._finish(
            run_id,
            attempt_id,
            lambda r, at: decisions.yielded(r, reason, at),
            now,
            RunStatus.RELEASED,
        )

    def _finish(
        self,
        run_id: str,
        attempt_id: str,
        update: Update,
        now: Moment,
        status: RunStatus,
        *,
        keep_for: timedelta | None = None,
    ) -> bool:
        def finish(record: RunRecord, at: datetime) -> RunRecord:
            return decisions.kept(update(record, at), at, keep_for)

        return self._if_held(run_id, attempt_id, finish, now, status) is not None

    def _if_held(
        self,
        run_id: str,
        attempt_id: str,
        update: Update,
        now: Moment,
        finished: RunStatus | None,
    ) -> RunRecord | None:
        """Write ``update(record, now)`` if ``attempt_id`` holds the claim; return the record.

        When the stored record shows that this attempt already finished the run with
        ``finished`` (an earlier try of this very call landed, though its call failed), that
        record is returned without writing. Otherwise None: the claim is gone.
        """

        def change(record: RunRecord | None) -> tuple[RunRecord | None, RunRecord | None]:
            if decisions.finished_by(record, attempt_id, finished):
                return None, record
            if record is None or not decisions.holds(record, attempt_id):
                return None, None
            written = update(record, resolve(now))
            return written, written

        return self._read_modify_write(run_id, change)

    # --- Operations: listing, lookup and operator actions (issue 17) ------------------------
    # Backends implement _scan_runs and _find_by_identity; the rest is built on them here.

    def _scan_runs(self, filters: RunFilter, after: Position | None, limit: int) -> list[RunRecord]:
        """Up to ``limit`` records after ``after`` in listing order (``claimed_at``, then
        ``run_id``, both descending), filtered by as much of ``filters`` as the backend can
        apply where the data is (the caller applies all of it again). Fewer than ``limit``
        means there are no more."""
        raise NotImplementedError(f"{type(self).__name__} cannot list runs for operators")

    def _find_by_identity(self, name: str, value: str) -> list[RunRecord]:
        """Every record whose ``identity[name]`` is ``value``, in any order."""
        raise NotImplementedError(f"{type(self).__name__} cannot look runs up")

    def _operator_change(self, run_id: str, change: Change[_T]) -> _T:
        """Apply an operator's ``change`` atomically (a backend may use a cheaper
        compare-and-set than :meth:`_read_modify_write`)."""
        return self._read_modify_write(run_id, change)

    def query_runs(
        self,
        filters: RunFilter | None = None,
        limit: int = 50,
        cursor: str | None = None,
        *,
        max_scan: int = 5000,
    ) -> RunPage:
        """A page of up to ``limit`` runs matching ``filters``, newest claim first.

        Pass the page's ``cursor`` back for the next page. Filters a backend cannot apply
        where the data is are applied here; ``max_scan`` bounds the records read for one
        page, which may then come back short with a cursor to continue from.
        Raises ValueError for a cursor this store did not hand out.
        """
        # Operators' listing: imported on use, a worker's deliveries never list.
        from tasklease.worker.queries import (  # noqa: PLC0415
            MAX_PAGE,
            RunFilter,
            RunPage,
            decode_cursor,
            encode_cursor,
        )

        filters = filters or RunFilter()
        limit = max(1, min(limit, MAX_PAGE))
        after = decode_cursor(cursor)
        found: list[RunRecord] = []
        scanned = 0
        batch = min(max(limit * 2, 50), MAX_PAGE)
        while True:
            records = self._scan_runs(filters, after, batch)
            for record in records:
                scanned += 1
                after = (record.claimed_at, record.run_id)
                if filters.matches(record):
                    found.append(record)
                    if len(found) == limit:
                        return RunPage(found, encode_cursor(after))
            if len(records) < batch:
                return RunPage(found, None)
            if scanned >= max_scan:
                return RunPage(found, None if after is None else encode_cursor(after))

    def find_runs(
        self,
        *,
        task_name: str | None = None,
        job_name: str | None = None,
        schedule_time: str | None = None,
    ) -> list[RunRecord]:
        """The runs of one task (by its Cloud Tasks name) or of one job (optionally only its
        run for ``schedule_time``, RFC 3339 with any offset: the same instant matches),
        newest claim first."""
        if (task_name is None) == (job_name is None):
            raise ValueError("look runs up by task_name or by job_name, not both or neither")
        if task_name is not None:
            records = self._find_by_identity("task_name", task_name)
        else:
            assert job_name is not None
            records = self._find_by_identity("job_name", job_name)
            if schedule_time is not None:
                wanted = _instant(schedule_time)
                if wanted is None:
                    raise ValueError(f"schedule_time {schedule_time!r} is not RFC 3339")
                records = [
                    r for r in records if _instant(r.identity.get("schedule_time")) == wanted
                ]
        return sorted(records, key=lambda r: (r.claimed_at, r.run_id), reverse=True)

    def operator_release(
        self,
        run_id: str,
        now: Moment,
        *,
        force: bool = False,
        attempt_id: str | None = None,
        fencing_token: int | None = None,
    ) -> decisions.OperatorRelease:
        """An operator gives the run's claim back (see :func:`decisions.operator_release`):
        refused while its lease is live unless ``force``, and unless ``attempt_id`` /
        ``fencing_token`` (when given) still hold it; the old holder is fenced out."""
        operator = f"operator-{uuid.uuid4().hex}"
        holder = (attempt_id, fencing_token)

        def change(
            record: RunRecord | None,
        ) -> tuple[RunRecord | None, decisions.OperatorRelease]:
            decision = decisions.operator_release(record, resolve(now), operator, force, holder)
            released = decision.outcome is decisions.ReleaseOutcome.RELEASED
            written = decision.record if released else None
            return written, decision

        return self._operator_change(run_id, change)

    def add_replay(self, pending: RunRecord) -> RunRecord:
        """Write a replay's record before its first delivery, unless its run already has one
        (an earlier replay, or the delivery came first); return the stored record."""

        def change(record: RunRecord | None) -> tuple[RunRecord | None, RunRecord]:
            return (None, record) if record is not None else (pending, pending)

        return self._operator_change(pending.run_id, change)

    def mark_replayed(self, run_id: str, replayed_as: str) -> RunRecord | None:
        """Link a failed run to the run that replays it; return the record (None: gone)."""

        def change(record: RunRecord | None) -> tuple[RunRecord | None, RunRecord | None]:
            if record is None or record.replayed_as == replayed_as:
                return None, record
            linked = record.replace(replayed_as=replayed_as)
            return linked, linked

        return self._operator_change(run_id, change)
