"""The operator-queries capability of a store: listings, look-ups and operators' changes."""

from __future__ import annotations

import uuid
from abc import abstractmethod
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from tasklease.errors import ConfigurationError
from tasklease.worker.core import decisions
from tasklease.worker.core.identity import parse_rfc3339
from tasklease.worker.core.records import RunRecord
from tasklease.worker.stores.base.store import Change, LeaseStore, Moment, resolve

if TYPE_CHECKING:
    # The listing's rules load when a listing is asked for: a worker that only serves
    # deliveries never needs them (its cold start is measured by bench/cold_start.py).
    from tasklease.worker.core.queries import Position, RunFilter, RunPage

_T = TypeVar("_T")


def _instant(text: str | None) -> datetime | None:
    return parse_rfc3339(text) if text else None


class OperatorQueries(LeaseStore):
    """A store whose runs operators can list and look up: ``tasklease runs``, ``tasklease
    locks`` and the dashboard need it (:class:`~tasklease.worker.operate.operations.Operations`).

    A backend inherits it beside :class:`LeaseStore` and implements two primitives:

    - :meth:`_scan_runs`: a page of records in listing order (newest claim first), after a
      position, filtered where the data is as far as the backend can (the caller filters
      again, so a backend may apply none of the filters, at the cost of reading more).
    - :meth:`_find_by_identity`: the records of one task name or one job name.

    Both are plain reads with no atomicity asked of them beyond each record's own: a run
    changed during a listing may be listed as before or after the change. Paging, look-up by
    schedule time, operator release and replay links are built on them and on
    :meth:`LeaseStore._read_modify_write` here (:meth:`_operator_change` may be overridden
    with a cheaper compare-and-set). :class:`tasklease.testing.store_contract.OperationsContract`
    tests them.
    """

    @abstractmethod
    def _scan_runs(self, filters: RunFilter, after: Position | None, limit: int) -> list[RunRecord]:
        """Up to ``limit`` records after ``after`` in listing order (``claimed_at``, then
        ``run_id``, both descending), filtered by as much of ``filters`` as the backend can
        apply where the data is (the caller applies all of it again). Fewer than ``limit``
        means there are no more."""

    @abstractmethod
    def _find_by_identity(self, name: str, value: str) -> list[RunRecord]:
        """Every record whose ``identity[name]`` is ``value``, in any order (``name`` is
        ``task_name`` or ``job_name``)."""

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
        from tasklease.worker.core.queries import (  # noqa: PLC0415 - see the imports.
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


def operator_queries(store: LeaseStore, feature: str = "operator features") -> OperatorQueries:
    """``store`` as :class:`OperatorQueries`; :class:`ConfigurationError` naming ``feature``
    and the store if it cannot list runs."""
    if isinstance(store, OperatorQueries):
        return store
    raise ConfigurationError(
        f"{feature} need a store with operator queries, but {store!r} does not implement "
        "OperatorQueries (listing and looking up runs)"
    )


__all__ = ["OperatorQueries", "operator_queries"]
