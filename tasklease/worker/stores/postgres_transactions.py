"""A transactional handler's transaction on the Postgres store: a pooled psycopg
``Connection`` inside ``BEGIN``, in pipeline mode, and the run's completion as one
conditional ``UPDATE`` in that transaction.

Round trips beyond the handler's own: none before it (``BEGIN`` is queued and goes out with
the handler's first statement), one after it: the conditional completion and ``COMMIT`` sent
together. When the attempt no longer holds the claim the completion fails on purpose
(``Statements.complete_held``), the transaction aborts and the ``COMMIT`` rolls it back.

The handler gets the connection wrapped (:mod:`.postgres_handler_transaction`): it cannot
commit or roll back the transaction itself.

Pipeline mode means a statement whose result the handler never fetches is checked only at
the next fetch or at the commit: its error then ends the transaction as if raised there.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import Connection
from psycopg.pq import TransactionStatus
from psycopg_pool import PoolTimeout

from tasklease.worker.core import decisions
from tasklease.worker.core.constants import MAX_CLOCK_SKEW
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.base import Moment
from tasklease.worker.stores.postgres_handler_transaction import guarded
from tasklease.worker.stores.postgres_watchdog import CallTimedOut
from tasklease.worker.stores.transactional import TransactionOutcome, Work

if TYPE_CHECKING:
    from tasklease.worker.stores.postgres import PostgresStore

__all__ = ["complete_in_transaction"]


class _HandlerError(Exception):
    """A database error of the handler's own statements, carried past the store's mapping
    of database errors to StoreUnavailable."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def complete_in_transaction(
    store: PostgresStore,
    run_id: str,
    attempt_id: str,
    work: Work,
    *,
    now: Moment,
    keep_for: timedelta | None,
) -> TransactionOutcome:
    """See :meth:`TransactionalStore.complete_in_transaction`. Never retried here: a call
    whose commit may have landed must be decided by reading the record."""
    process = store._ready_process()
    at = None if callable(now) and store.options.server_clock else _fixed(now)
    try:
        with process.pool.connection(timeout=store.options.pool_timeout) as connection:
            try:
                committed = _run(
                    store, connection, work, at=at, keep_for=keep_for, run=(run_id, attempt_id)
                )
            finally:
                if connection.info.transaction_status is not TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        connection.rollback()
    except _HandlerError as exc:
        raise exc.error from None
    except CallTimedOut as exc:
        raise store._unavailable(
            "commit a transaction",
            f"the server did not answer within {store.options.call_timeout:g}s",
        ) from exc
    except PoolTimeout as exc:
        raise store._unavailable("start a transaction", f"no connection: {exc}") from exc
    except psycopg.Error as exc:
        raise store._unavailable("commit a transaction", str(exc)) from exc
    if committed is None:  # The completion found the claim gone: nothing was kept.
        return TransactionOutcome(held=False, result_json=None)
    process.writes.pop((run_id, attempt_id), None)  # Finished: nothing to condition on.
    return TransactionOutcome(held=True, result_json=committed[0])


def _run(
    store: PostgresStore,
    connection: Connection[Any],
    work: Work,
    *,
    at: datetime | None,
    keep_for: timedelta | None,
    run: tuple[str, str],
) -> tuple[str | None] | None:
    """The transaction; ``(result_json,)`` if it committed, None if the claim was gone."""
    run_id, attempt_id = run
    process = store._process.get()
    refused: psycopg.Error | None = None
    try:
        with connection.pipeline() as pipeline:
            connection.execute("BEGIN")
            try:
                with guarded(connection) as transaction:
                    result_json = work(transaction)
            except psycopg.Error as exc:
                raise _HandlerError(exc) from exc
            params = [
                at,
                RunStatus.COMPLETED.value,
                result_json,
                keep_for or timedelta(0),
                MAX_CLOCK_SKEW,
                run_id,
                attempt_id,
                RunStatus.IN_PROGRESS.value,
            ]
            try:  # An error may surface at any call from here: psycopg reads results eagerly.
                completion = connection.execute(store._statements.complete_held, params)
                connection.execute("COMMIT")
                with process.watchdog.bounded(connection, store.options.call_timeout):
                    pipeline.sync()
                completion.fetchone()
            except (psycopg.errors.DivisionByZero, psycopg.errors.PipelineAborted) as exc:
                # The completion refused (the claim is gone), or an earlier statement of the
                # handler's failed and the rest was skipped: the record tells which.
                refused = exc
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:  # An unfetched statement of the handler's failed.
                raise _HandlerError(exc) from exc
    except psycopg.errors.PipelineAborted:
        if refused is None:  # Leaving the aborted pipeline repeats what was decided above.
            raise
    if refused is None:
        return (result_json,)
    if decisions.holds(store.get(run_id), attempt_id):
        raise _HandlerError(refused) from refused  # Then it was the handler's own statement.
    return None


def _fixed(now: Moment) -> datetime:
    return now() if callable(now) else now
