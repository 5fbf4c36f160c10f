"""The lease store contract: one base class, every backend a subclass."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from worker import decisions
from worker.records import Claim, ClaimRequest, RunRecord, RunStatus

_T = TypeVar("_T")

Change = Callable[[RunRecord | None], tuple[RunRecord | None, _T]]
"""Given the stored record (or None), returns the record to write (None: write nothing) and a
value for the caller."""


class LeaseStore(ABC):
    """Keeps one :class:`~worker.records.RunRecord` per run and changes it atomically.

    A backend implements three primitives:

    - :meth:`_read_modify_write`: read one record and apply a change to it atomically, so that
      two concurrent changes to one run never both see the same old record. This carries every
      rule: claim, renew, complete, fail and release are all built on it here, with the rules
      themselves in :mod:`worker.decisions`.
    - :meth:`get` and :meth:`list_runs`: plain reads.
    - :meth:`purge_expired`: delete records past ``expire_at``.

    A backend may override :meth:`claim` and :meth:`_if_held` (which renew, complete, fail
    and release go through) with faster equivalents, as the Firestore store does with
    single-document preconditions, as long as the contract tests still pass.

    Concurrency: every method may be called from many threads, and a store built from the same
    configuration in several processes must behave as one store. Every method raises
    :class:`~worker.errors.StoreUnavailable` (and nothing else) when the backend fails; when it
    does, nothing was changed or the change is indistinguishable from one that was not made.
    """

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

    def claim(self, request: ClaimRequest, now: datetime) -> Claim:
        """Claim the run for ``request.attempt_id`` unless it is done or leased by another."""

        def change(record: RunRecord | None) -> tuple[RunRecord | None, Claim]:
            outcome = decisions.claim(record, request, now)
            return (outcome.record if outcome.record is not record else None), outcome

        return self._read_modify_write(request.run_id, change)

    def renew(self, run_id: str, attempt_id: str, lease_expires: datetime) -> bool:
        """Extend the lease if ``attempt_id`` still holds the claim; False if it does not."""
        return self._if_held(run_id, attempt_id, lambda r: decisions.renewed(r, lease_expires))

    def complete(self, run_id: str, attempt_id: str, result: Any, now: datetime) -> bool:
        """Record success with ``result`` if ``attempt_id`` still holds the claim."""
        return self._if_held(run_id, attempt_id, lambda r: decisions.completed(r, result, now))

    def fail(
        self, run_id: str, attempt_id: str, error: str, now: datetime, payload: str | None = None
    ) -> bool:
        """Record a permanent failure (a dead letter) if ``attempt_id`` still holds the claim."""
        return self._if_held(run_id, attempt_id, lambda r: decisions.failed(r, error, payload, now))

    def release(self, run_id: str, attempt_id: str, error: str, now: datetime) -> bool:
        """Give the claim back after a retryable failure, so the next delivery runs at once.

        The record stays (released) rather than being deleted, so the fencing token and the
        attempt count keep growing across attempts.
        """
        return self._if_held(run_id, attempt_id, lambda r: decisions.released(r, error, now))

    def _if_held(
        self, run_id: str, attempt_id: str, update: Callable[[RunRecord], RunRecord]
    ) -> bool:
        def change(record: RunRecord | None) -> tuple[RunRecord | None, bool]:
            if record is None or not decisions.holds(record, attempt_id):
                return None, False
            return update(record), True

        return self._read_modify_write(run_id, change)
