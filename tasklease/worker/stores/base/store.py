"""The lease store contract: the primitives every store implements for runs.

Locks and operator queries are optional capabilities with their own classes
(:mod:`.lock_store`, :mod:`.operator_queries`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import ClassVar, TypeVar

from tasklease.worker.core import cancellation, decisions, steps, waits
from tasklease.worker.core.records import Claim, ClaimRequest, LockRecord, RunRecord, RunStatus
from tasklease.worker.core.steps import StepRecord

_T = TypeVar("_T")

Moment = datetime | Callable[[], datetime]
"""A time, or a clock that a store reads as late as it can: inside its atomic change, after any
wait for a lock, so that a lease is never computed from a time read before a long wait."""

Update = Callable[[RunRecord, datetime], RunRecord]
"""Given the record an attempt holds and the time, returns the record to write."""

Change = Callable[[RunRecord | None], tuple[RunRecord | None, _T]]
"""Given the stored record (or None), returns the record to write (None: write nothing) and a
value for the caller."""


RunReader = Callable[[str], RunRecord | None]
"""Reads a run's record (expired or not) as part of a lock's atomic change."""

LockChange = Callable[[LockRecord | None, RunReader], tuple[LockRecord | None, _T]]
"""Given the stored lock (or None) and a reader of runs, returns the lock to write (None: write
nothing) and a value for the caller."""


def resolve(now: Moment) -> datetime:
    """The time ``now`` stands for: itself, or the clock's reading at this moment."""
    return now() if callable(now) else now


class LeaseStore(ABC):
    """Keeps one :class:`~tasklease.worker.core.records.RunRecord` per run, changed atomically.

    The required part of every store: what runs need. A backend implements four primitives:

    - :meth:`_read_modify_write`: read one record and apply a change to it atomically, so that
      two concurrent changes to one run never both see the same old record. This carries every
      rule: claim, renew, complete, fail and release are all built on it here, with the rules
      themselves in :mod:`tasklease.worker.core.decisions`.
    - :meth:`get` and :meth:`list_runs`: plain reads.
    - :meth:`purge_expired`: delete records past ``expire_at`` (and, for a store that keeps
      locks, the locks that decide nothing any more).

    Two capabilities are classes of their own, which a store inherits beside this one when it
    implements their primitives (every shipped store inherits both):

    - :class:`~tasklease.worker.stores.base.locks.LockStore`: locks, for exclusive jobs and
      concurrency keys. ``create_app`` refuses such handlers on a store without it.
    - :class:`~tasklease.worker.stores.base.queries.OperatorQueries`: listings and
      look-ups for ``tasklease runs`` and the dashboard, which are refused without it.

    A backend may override :meth:`claim` and :meth:`_if_held` (which renew, complete, fail
    and release go through) with faster equivalents, as the Firestore store does with
    single-document preconditions, as long as the contract tests still pass. Either must
    read a :data:`Moment` as late as it can, and must recognise its own earlier write when a
    call that landed is retried (the stored attempt id says whose write it is).

    Concurrency: every method may be called from many threads, and a store built from the same
    configuration in several processes must behave as one store. Every method raises
    :class:`~tasklease.errors.StoreUnavailable` (and nothing else) when the backend
    fails; when it does, nothing was changed or the change is indistinguishable from one that
    was not made. :mod:`tasklease.testing.store_contract` holds the tests that prove it.

    ``shared_across_instances`` says whether every instance of a service reaching the same
    configuration sees the same records (a database service does; a file or process memory
    does not): :func:`~tasklease.worker.stores.check_store_is_shared` refuses the latter on
    Cloud Run.

    ``max_record_bytes`` is the most one run's record may take in the store (None: no limit
    a record nears); a dead letter whose payload would pass it keeps no payload, and says so.
    """

    shared_across_instances: ClassVar[bool] = True
    max_record_bytes: ClassVar[int | None] = None

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

        Returns the new expiry, or None if the claim is gone (:meth:`renew_run` returns
        the record).
        """
        record = self.renew_run(run_id, attempt_id, lease, now, keep_for=keep_for)
        return None if record is None else record.lease_expires

    def renew_run(
        self,
        run_id: str,
        attempt_id: str,
        lease: timedelta,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> RunRecord | None:
        """:meth:`renew`, returning the record written (None: the claim is gone), so the
        holder learns what others wrote meanwhile (a cancellation's mark) with no read.
        The lease keeper renews through this; a store overrides this one, not :meth:`renew`."""
        return self._if_held(
            run_id,
            attempt_id,
            lambda r, at: decisions.renewed(r, at + lease, keep_for),
            now,
            None,
        )

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
            lambda r, at: decisions.failed(r, error, payload, at, room=self.max_record_bytes),
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

    def record_step(self, run_id: str, attempt_id: str, step: StepRecord) -> RunRecord | None:
        """Add the completed ``step`` to the run if ``attempt_id`` still holds the claim: one
        fenced write. Returns the record written, or None when the claim is gone (the step's
        result is refused, as a stale attempt's finish is). A retried call whose first try
        landed writes nothing new (the step is already there, by this attempt). Raises
        :class:`~tasklease.worker.core.steps.StepError`, writing nothing, when the step
        would take the run's steps past their cap (besides ``StoreUnavailable``)."""
        return self._if_held(
            run_id, attempt_id, lambda r, _: steps.with_step(r, step), step.completed_at, None
        )

    def continue_run(
        self,
        run_id: str,
        attempt_id: str,
        continuation_json: str,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> bool:
        """End this attempt's delivery with a continuation (``ctx.continue_later``): record
        it and give the claim back, not counted as a failure, if ``attempt_id`` still holds
        it. The run stays open (released) until a delivery returns without continuing. The
        record is kept at least ``keep_for`` past the moment the continuation is due (its
        delay from now), so that the continuation finds it."""
        return self._finish(
            run_id,
            attempt_id,
            lambda r, at: decisions.continued(r, continuation_json, at, keep_for),
            now,
            RunStatus.RELEASED,
            keep_for=keep_for,
        )

    def suspend(
        self,
        run_id: str,
        attempt_id: str,
        wait: waits.Wait | None,
        payload: str | None,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> RunRecord | None:
        """End this attempt's delivery waiting on ``wait`` (``ctx.wait_for``), its steps
        kept, if ``attempt_id`` still holds the claim; return the record written (None: the
        claim is gone). A signal that came while the handler ran is in it, as the atomic
        change found it: then its resume is due."""
        return self._if_held(
            run_id,
            attempt_id,
            lambda r, at: decisions.kept(
                decisions.waiting(r, wait, payload, at, keep_for), at, keep_for
            ),
            now,
            RunStatus.WAITING,
        )

    def resolve_wait(
        self, run_id: str, attempt_id: str, name: str, seq: int, now: Moment
    ) -> waits.Resolution:
        """Take the signal of wait ``name`` (delivery ``seq``), or note its timeout when
        due, and record how it resolved as a step: one fenced write, if ``attempt_id`` still
        holds the claim. A retried call whose first try landed finds its step."""

        def change(record: RunRecord | None) -> tuple[RunRecord | None, waits.Resolution]:
            if record is None or not decisions.holds(record, attempt_id):
                return None, waits.Resolution(held=False)
            done = steps.steps_of(record).get(waits.step_name(name))
            if done is not None:
                return None, waits.Resolution(held=True, step=done)
            outcome = waits.resolved(record, name, seq, attempt_id, resolve(now))
            if outcome is None:
                return None, waits.Resolution(held=True)
            return outcome[0], waits.Resolution(held=True, step=outcome[1])

        return self._read_modify_write(run_id, change)

    def signal_run(
        self, run_id: str, name: str, payload_json: str, now: Moment
    ) -> waits.SignalDecision:
        """Record the signal ``name`` for the run unless it has ended or has had a signal
        of that name: one atomic change. Raises
        :class:`~tasklease.worker.core.waits.SignalError`, writing nothing, when the run's
        record cannot hold it."""

        def change(record: RunRecord | None) -> tuple[RunRecord | None, waits.SignalDecision]:
            at = resolve(now)
            live = decisions.is_live(record, at)
            return waits.signalled(
                record, name, payload_json, at, live=live, room=self.max_record_bytes
            )

        return self._read_modify_write(run_id, change)

    def cancel_run(self, run_id: str, by: str, now: Moment) -> cancellation.CancelDecision:
        """Cancel the run for ``by``: at once if nothing runs it, else mark it for its
        holder to end (:mod:`tasklease.worker.core.cancellation`). One atomic change."""

        def change(
            record: RunRecord | None,
        ) -> tuple[RunRecord | None, cancellation.CancelDecision]:
            at = resolve(now)
            return cancellation.cancelled(record, by, at, live=decisions.is_live(record, at))

        return self._read_modify_write(run_id, change)

    def end_cancelled(
        self,
        run_id: str,
        attempt_id: str,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
        by: str | None = None,
    ) -> bool:
        """End a run marked cancelled as ``cancelled``, if ``attempt_id`` still holds it.
        ``by`` names who cancelled it when its record carries no mark (a fan-out child
        whose parent was cancelled)."""
        return self._finish(
            run_id,
            attempt_id,
            lambda r, at: cancellation.ended_cancelled(r, at, by),
            now,
            RunStatus.CANCELLED,
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
