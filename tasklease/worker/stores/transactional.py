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

from tasklease.worker.stores.base import LeaseStore, Moment

__all__ = ["TRANSACTIONAL_STORES", "TransactionOutcome", "TransactionalStore", "Work"]

TRANSACTIONAL_STORES = "SqliteStore, PostgresStore, SpannerStore or FirestoreStore"
"""The shipped stores that can run a transactional handler, for refusals to name."""

Work = Callable[[Any], str | None]
"""Given the store's native transaction, do the handler's writes through it and return the
run's serialised result (JSON text, or None)."""


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
