"""The lock capability of a store: exclusive jobs and concurrency keys."""

from __future__ import annotations

from abc import abstractmethod
from datetime import datetime, timedelta
from typing import TypeVar

from tasklease.errors import ConfigurationError
from tasklease.worker.core import locking
from tasklease.worker.core.records import LockGrant, LockRecord, LockRequest
from tasklease.worker.stores.base.store import LeaseStore, LockChange, Moment, RunReader, resolve

_T = TypeVar("_T")


class LockStore(LeaseStore):
    """A store that keeps :class:`~tasklease.worker.core.records.LockRecord` s beside its runs
    (a table, a collection): needed by exclusive jobs and handlers with a concurrency key.

    A backend inherits it beside (or instead of) :class:`LeaseStore` and implements three
    primitives:

    - :meth:`_read_modify_write_lock`: apply a change to one lock atomically, as
      :meth:`LeaseStore._read_modify_write` does for a run. The change may read the holder's
      run record through the reader it is given: a holder whose own attempt recorded its
      run's end holds nothing, so a release that was lost never blocks the next run; and a
      requester of the lock's own run whose claim has passed to another attempt is refused.
      Read it in the same transaction where the backend can (SQLite, memory, Postgres);
      reading it beside the lock's compare-and-set (Firestore) is enough, because neither
      "this attempt ended its run" nor "this run's claim passed on from that attempt" ever
      becomes false again (attempt ids are single use).
    - :meth:`get_lock` and :meth:`list_locks`: plain reads.

    and purges lapsed locks (:func:`tasklease.worker.core.locking.lapses_at`) in
    :meth:`LeaseStore.purge_expired`. Acquire, renew and release are built on them here, with
    the rules in :mod:`tasklease.worker.core.locking`.

    Lock fencing tokens grow for the life of a key although lapsed locks are deleted (purged,
    or by a TTL policy on ``lapses_at``): a token is at least its grant's time in
    microseconds, and a lock is deleted only ``LOCK_TOKEN_MARGIN`` after the time its token
    stands for (:func:`tasklease.worker.core.locking.next_token`). Keeping every key's record, or a
    store-wide counter, would do it too, but the first grows with every key ever used (one
    per account, say) and the second makes every grant write one document, which Firestore
    sustains at about one write a second.

    The concurrency rules of :class:`LeaseStore` hold for every method here too;
    :class:`tasklease.testing.store_contract.LockContract` tests them.
    """

    @abstractmethod
    def _read_modify_write_lock(self, name: str, change: LockChange[_T]) -> _T:
        """Apply ``change`` to the lock called ``name`` atomically; return its value."""

    @abstractmethod
    def get_lock(self, name: str) -> LockRecord | None:
        """The stored lock called ``name``, or None."""

    @abstractmethod
    def list_locks(self, limit: int = 100) -> list[LockRecord]:
        """Up to ``limit`` stored locks, latest start first (lapsed ones until purged)."""

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


def lock_store(store: LeaseStore) -> LockStore:
    """``store`` as a :class:`LockStore`; :class:`ConfigurationError` if it keeps no locks."""
    if isinstance(store, LockStore):
        return store
    raise ConfigurationError(
        f"{store!r} keeps no locks (it does not implement LockStore): exclusive jobs, "
        "concurrency keys and lock operations need a store that does"
    )


__all__ = ["LockStore", "lock_store"]
