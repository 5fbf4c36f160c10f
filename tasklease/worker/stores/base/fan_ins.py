"""The fan-in capability of a store: joins, counted with their children's final records.

The rules are in :mod:`tasklease.worker.core.fan_in`; the delivery side (closing a join,
enqueueing its ``then`` task) in :mod:`tasklease.worker.delivery.fan_in`.
"""

from __future__ import annotations

from abc import abstractmethod
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

from tasklease.joins import Member
from tasklease.worker.core import cancellation, decisions
from tasklease.worker.core import fan_in as rules
from tasklease.worker.core.fan_in import ChildEntry, FanInRecord, Progress
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.stores.base.store import Change, LeaseStore, Moment, Update, resolve

__all__ = ["FanInStore", "JoinRows", "count_member_in"]

_T = TypeVar("_T")

DEFAULT_KEEP = timedelta(days=7)  # A join's keep when its child names no retention.


class JoinRows(Protocol):
    """The join's rows as one atomic operation of a store sees them (a transaction, or a
    store's lock): what :func:`count_member_in` reads and writes."""

    def join(self, join_id: str) -> FanInRecord | None: ...

    def has_entry(self, join_id: str, key: str) -> bool: ...

    def add_entry(self, entry: ChildEntry) -> None: ...

    def put_join(self, join: FanInRecord) -> None: ...


def count_member_in(
    rows: JoinRows, after: RunRecord | None, member: Member, at: datetime, keep_for: timedelta
) -> Progress:
    """Count ``member`` in its join if its record ``after`` is final and its key is not yet
    there (the join created by its first counted child); return the join's progress. Call it
    inside the operation that wrote ``after``, for stores with one record per join."""
    join = rows.join(member.join_id)
    entry = rules.entry_of(after, member)
    if entry is not None and not rows.has_entry(member.join_id, member.key):
        rows.add_entry(entry)
        join = rules.counted(join or rules.opened(member, at, keep_for), entry, at, keep_for)
        rows.put_join(join)
    return Progress(
        member.join_id,
        closed=join is not None and join.closed,
        then_enqueued=join is not None and join.then_enqueued_at is not None,
    )


class FanInStore(LeaseStore):
    """A store that keeps joins (``fan_out(..., then=...)``) beside its runs.

    A backend inherits it beside :class:`LeaseStore` and implements:

    - :meth:`_read_modify_write_member`: apply a change to a child's run record atomically
      with its join: when the record after the change (written, or as stored) is final, the
      child's :class:`~tasklease.worker.core.fan_in.ChildEntry` is added to the join unless its key
      is there already, and counted, in the same atomic operation as the record's write.
      Stores with one record per join do it with :func:`count_member_in`; a sharded store
      counts the child's shard, and the root only when that shard fills.
    - :meth:`get_fan_in`, :meth:`fan_in_entries` (ordered by key, for paging),
      :meth:`fan_ins_of`, and :meth:`mark_then_enqueued`; and purges joins past their
      ``expire_at`` (with their entries) in ``purge_expired``.

    :class:`tasklease.testing.fan_in_contract.FanInContract` holds the tests.
    """

    @abstractmethod
    def _read_modify_write_member(
        self, run_id: str, member: Member, change: Change[_T], now: Moment, keep_for: timedelta
    ) -> tuple[_T, Progress]:
        """Apply ``change`` to ``run_id``'s record and count ``member`` (see the class)
        atomically; ``now`` is read inside. Return the change's value and the progress."""

    @abstractmethod
    def get_fan_in(self, join_id: str) -> FanInRecord | None:
        """The join ``join_id`` with its counts (summed over shards), or None."""

    @abstractmethod
    def fan_in_entries(
        self, join_id: str, after: str | None = None, limit: int = rules.MAX_INLINE_RESULTS
    ) -> list[ChildEntry]:
        """Up to ``limit`` of the join's entries with keys after ``after``, by key."""

    @abstractmethod
    def fan_ins_of(self, parent_run_id: str, limit: int = 100) -> list[FanInRecord]:
        """The joins the run ``parent_run_id`` fanned out (newest first)."""

    @abstractmethod
    def mark_then_enqueued(self, join_id: str, now: datetime) -> None:
        """Note that the join's ``then`` task was created (kept if already noted)."""

    def fan_in_progress(self, join_id: str) -> Progress | None:
        """Whether the join is closed and its ``then`` noted (None: no child counted yet): what
        a finished child's duplicate reads. A sharded store answers from its root alone."""
        join = self.get_fan_in(join_id)
        if join is None:
            return None
        return Progress(join_id, join.closed, join.then_enqueued_at is not None)

    def complete_member(
        self,
        member: Member,
        run_id: str,
        attempt_id: str,
        result_json: str | None,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> Progress | None:
        """:meth:`LeaseStore.complete`, with the child counted in the same operation. None:
        the claim is gone (nothing written, nothing counted)."""
        return self._finish_member(
            member,
            run_id=run_id,
            attempt_id=attempt_id,
            update=lambda r, at: decisions.completed(r, result_json, at),
            now=now,
            status=RunStatus.COMPLETED,
            keep_for=keep_for,
        )

    def fail_member(
        self,
        member: Member,
        run_id: str,
        attempt_id: str,
        error: str,
        now: Moment,
        *,
        payload: str | None = None,
        keep_for: timedelta | None = None,
    ) -> Progress | None:
        """:meth:`LeaseStore.fail`, with the child counted (as failed) in the same operation."""
        return self._finish_member(
            member,
            run_id=run_id,
            attempt_id=attempt_id,
            update=lambda r, at: decisions.failed(
                r, error, payload, at, room=self.max_record_bytes
            ),
            now=now,
            status=RunStatus.FAILED,
            keep_for=keep_for,
        )

    def end_cancelled_member(
        self,
        member: Member,
        run_id: str,
        attempt_id: str,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
        by: str | None = None,
    ) -> Progress | None:
        """:meth:`LeaseStore.end_cancelled`, with the child counted in its join (a cancelled
        child counts as failed: the join still closes) in the same operation."""
        return self._finish_member(
            member,
            run_id=run_id,
            attempt_id=attempt_id,
            update=lambda r, at: cancellation.ended_cancelled(r, at, by),
            now=now,
            status=RunStatus.CANCELLED,
            keep_for=keep_for,
        )

    def count_member(
        self, member: Member, run_id: str, now: Moment, *, keep_for: timedelta | None = None
    ) -> Progress:
        """Count a child whose final record was written without its join (a transactional
        handler's, in the handler's own transaction), or find it counted: writes no record."""
        return self._read_modify_write_member(
            run_id, member, lambda record: (None, None), now, keep_for or DEFAULT_KEEP
        )[1]

    def _finish_member(
        self,
        member: Member,
        *,
        run_id: str,
        attempt_id: str,
        update: Update,
        now: Moment,
        status: RunStatus,
        keep_for: timedelta | None,
    ) -> Progress | None:
        def change(record: RunRecord | None) -> tuple[RunRecord | None, bool]:
            if decisions.finished_by(record, attempt_id, status):
                return None, True  # An earlier try of this call landed: counted with it.
            if record is None or not decisions.holds(record, attempt_id):
                return None, False
            at = resolve(now)
            return decisions.kept(update(record, at), at, keep_for), True

        held, progress = self._read_modify_write_member(
            run_id, member, change, now, keep_for or DEFAULT_KEEP
        )
        return progress if held else None
