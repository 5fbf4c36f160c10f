"""The transaction capability of a store: a handler's writes and its run's completion record
commit together, or neither does.

This is what makes a database effect exactly once without an idempotency key: a retry after a
crash finds either the completed record (and the effect) or neither.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

from tasklease.worker.core.steps import StepRecord
from tasklease.worker.stores.base.store import LeaseStore, Moment

__all__ = [
    "TRANSACTIONAL_STEP_STORES",
    "TRANSACTIONAL_STORES",
    "StepWork",
    "TransactionOutcome",
    "TransactionalStore",
    "Work",
    "records_steps_in_transactions",
]

TRANSACTIONAL_STORES = "SqliteStore, PostgresStore, SpannerStore or FirestoreStore"
"""The shipped stores that can run a transactional handler, for refusals to name."""

TRANSACTIONAL_STEP_STORES = "SqliteStore, PostgresStore, SpannerStore or FirestoreStore"
"""The shipped stores that can run a transactional step, for refusals to name."""

Work = Callable[[Any], str | None]
"""Given the store's native transaction, do the handler's writes through it and return the
run's serialised result (JSON text, or None)."""

StepWork = Callable[[Any], StepRecord]
"""Given the store's native transaction, do a step's writes through it and return the step's
record to write in the same transaction (``ctx.step(..., transactional=True)``)."""


@dataclass(frozen=True)
class TransactionOutcome:
    """How one :meth:`TransactionalStore.complete_in_transaction` call ended.

    ``held`` False: the attempt no longer held the claim when the transaction checked it, so
    the transaction was rolled back and nothing ``work`` wrote was kept. ``tries``: how many
    times the database ran ``work`` (Firestore and Spanner run a transaction again when it
    aborts on contention; always 1 where the database does not).
    """

    held: bool
    result_json: str | None
    tries: int = 1


class TransactionalStore(LeaseStore):
    """A store that can hand a handler its native transaction and write the run's completion
    record in it: needed by handlers registered with ``transactional=True``, which
    ``create_app`` refuses on a store without it.

    The transaction object a handler gets as ``ctx.transaction`` is the backend's own:
    ``sqlite3.Connection`` (SQLite) and a psycopg ``Connection`` inside a transaction
    (Postgres), each wrapped so that the handler cannot end the transaction
    (:mod:`.handler_transaction`), ``google.cloud.spanner_v1.transaction.Transaction``
    (Spanner), ``google.cloud.firestore.Transaction`` (Firestore).
    """

    transaction_reruns: ClassVar[bool] = False
    """Whether the database may run ``work`` more than once in one call (a retried
    transaction): a handler's code outside the transaction then runs again too."""

    @abstractmethod
    def complete_in_transaction(
        self,
        run_id: str,
        attempt_id: str,
        work: Work,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> TransactionOutcome:
        """In one transaction: run ``work(tx)``, then record the run completed with the
        result ``work`` returned, only if ``attempt_id`` still holds the claim (checked
        inside the transaction, so a takeover between the check and the commit is
        impossible); commit.

        If ``work`` raises, roll back and let the exception through. If the claim is gone,
        roll back and return ``held=False``. If the database fails, raise
        :class:`~tasklease.errors.StoreUnavailable`; when the commit's outcome is unknown,
        the record tells: completed by ``attempt_id`` means it committed, with the effect.
        """

    def record_step_in_transaction(
        self, run_id: str, attempt_id: str, step_work: StepWork, now: Moment
    ) -> TransactionOutcome:
        """In one transaction: run ``step_work(tx)``, then add the step record it returned to
        the run, only if ``attempt_id`` still holds the claim (checked inside the
        transaction); commit. The step's writes and its record commit together or not at
        all. ``result_json`` of the outcome is the step's. ``now`` is the time of the call,
        for a store whose write needs one.

        If ``step_work`` raises (or the step would pass the run's cap: ``StepError``), roll
        back and let the exception through. If the claim is gone, roll back and return
        ``held=False``. If the database fails, raise ``StoreUnavailable``; when the
        commit's outcome is unknown, the record tells (the step recorded by ``attempt_id``
        means it committed, with its writes).

        Optional: a store without it raises NotImplementedError, and a transactional step
        is refused on it before its function runs (:func:`records_steps_in_transactions`).
        """
        raise NotImplementedError(f"{self!r} does not record steps in its transactions")


def records_steps_in_transactions(store: LeaseStore | None) -> bool:
    """Whether ``store`` can run a transactional step (implements
    :meth:`TransactionalStore.record_step_in_transaction`)."""
    if not isinstance(store, TransactionalStore):
        return False
    own = type(store).record_step_in_transaction
    return own is not TransactionalStore.record_step_in_transaction
