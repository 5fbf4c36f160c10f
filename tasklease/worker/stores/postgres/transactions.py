"""A transactional handler's transaction on the Postgres store: a pooled psycopg
``Connection`` inside ``BEGIN``, in pipeline mode, and the run's completion as one
conditional ``UPDATE`` in that transaction.

Round trips beyond the handler's own: none before it (``BEGIN`` is queued and goes out with
the handler's first statement), one after it: the conditional completion, ``COMMIT`` and
``RESET ALL`` (what the handler set on the session ends with it) sent together. When the
attempt no longer holds the claim the completion fails on purpose
(``Statements.complete_held``), the transaction aborts and the ``COMMIT`` rolls it back.

The handler gets the connection wrapped (:mod:`.postgres_handler_transaction`): it cannot
commit or roll back the transaction itself.

The server never sees a pipelined transaction idle (``idle_in_transaction_session_timeout``
starts at a ReadyForQuery, which only a Sync brings), so the store bounds it itself: a
handler idle in it for ``Options.idle_in_transaction`` (no call of its waiting for the
server in that time: a statement that runs long keeps its fetch waiting) has its connection
cut (:meth:`.Watchdog.idle_bounded`), the server rolls the transaction back and frees its
locks, and the attempt ends as for a database that failed mid-transaction (the
record says nothing was committed; the run is given back for a retry).

Pipeline mode means a statement whose result the handler never fetches is checked only at
the next fetch or at the commit: its error then ends the transaction as if raised there.

A transactional step (``ctx.step(..., transactional=True)``) gets the same connection. Its
record is added to the run's row after its function: the row read ``FOR UPDATE`` (one round
trip; it waits for a renewal in flight, never for the step), then the conditional ``UPDATE``
and ``COMMIT`` together (one more). A step's row lock is taken last, so the attempt's own
renewals are not held up while the step's function runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import PoolTimeout

from tasklease.worker.core import decisions, steps
from tasklease.worker.core.constants import MAX_CLOCK_SKEW
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.stores.base.conditional_claims import RememberedWrites
from tasklease.worker.stores.base.store import Moment, RunReader
from tasklease.worker.stores.base.transactional import StepWork, TransactionOutcome, Work
from tasklease.worker.stores.postgres.connections import PostgresConnections
from tasklease.worker.stores.postgres.handler_transaction import guarded
from tasklease.worker.stores.postgres.schema import (
    RUN_COLUMNS,
    Statements,
    decode_run,
    encode_run,
)
from tasklease.worker.stores.postgres.watchdog import (
    CallTimedOut,
    IdleTimedOut,
    WatchedConnection,
)

__all__ = ["PostgresTransactions"]

_T = TypeVar("_T")

# Sent after the COMMIT, in the same pipeline (no round trip of its own): what the handler
# SET on the session (a tenant for row-level security, a time zone, a role) ends with its
# transaction, not carried into the next run the pool gives the connection. Every setting
# returns to the connection's own (its startup options included: postgresql.org/docs/
# current/sql-reset.html); a SET in a transaction that rolled back is undone already.
RESET_SESSION = "RESET ALL"


class _HandlerError(Exception):
    """A database error of the handler's own statements, carried past the store's mapping
    of database errors to StoreUnavailable."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class PostgresTransactions:
    """The transactions of the Postgres store: on ``connections``, with its ``statements``,
    keeping ``writes`` (its remembered writes) true to what they commit; ``get`` reads a
    run to tell a refused completion from the handler's own failed statement."""

    def __init__(
        self,
        connections: PostgresConnections,
        statements: Statements,
        writes: RememberedWrites[int],
        get: RunReader,
    ) -> None:
        self.connections = connections
        self.options = connections.options
        self.statements = statements
        self.writes = writes
        self.get = get

    def complete(
        self,
        run_id: str,
        attempt_id: str,
        work: Work,
        *,
        now: Moment,
        keep_for: timedelta | None,
    ) -> TransactionOutcome:
        """:meth:`TransactionalStore.complete_in_transaction`. Never retried here: a call
        whose commit may have landed must be decided by reading the record."""
        at = None if callable(now) and self.options.server_clock else _fixed(now)
        committed = self._transact(
            lambda connection: self._run(
                connection, work, at=at, keep_for=keep_for, run=(run_id, attempt_id)
            ),
        )
        if committed is None:  # The completion found the claim gone: nothing was kept.
            return TransactionOutcome(held=False, result_json=None)
        self.writes.forget(run_id, attempt_id)  # Finished: nothing to condition on.
        return TransactionOutcome(held=True, result_json=committed[0])

    def record_step(self, run_id: str, attempt_id: str, step_work: StepWork) -> TransactionOutcome:
        """:meth:`TransactionalStore.record_step_in_transaction`. Never retried here."""
        written = self._transact(
            lambda connection: self._run_step(connection, step_work, (run_id, attempt_id))
        )
        if written is None:  # The claim was gone: rolled back.
            return TransactionOutcome(held=False, result_json=None)
        record, version, step_json = written
        self.writes.remember(record, version)  # The attempt's next renewal is conditional on it.
        return TransactionOutcome(held=True, result_json=step_json)

    def _transact(self, body: Callable[[WatchedConnection], _T]) -> _T:
        """``body`` on a pooled connection, rolled back unless it committed; the database's
        errors as StoreUnavailable, the handler's own as raised."""
        connections, options = self.connections, self.options
        process = connections.ready_process()
        try:
            with process.pool.connection(timeout=options.pool_timeout) as connection:
                try:
                    return body(connection)
                finally:
                    if connection.info.transaction_status is not TransactionStatus.IDLE:
                        with contextlib.suppress(psycopg.Error):
                            connection.rollback()
        except _HandlerError as exc:
            raise exc.error from None
        except CallTimedOut as exc:
            raise connections.unavailable_error(
                "commit a transaction",
                f"the server did not answer within {options.call_timeout:g}s",
            ) from exc
        except IdleTimedOut as exc:
            raise connections.unavailable_error(
                "commit a transaction",
                f"the handler was {exc}: its connection was closed and the server rolled the "
                "transaction back",
            ) from exc
        except PoolTimeout as exc:
            raise connections.no_connection_error("start a transaction", exc) from exc
        except psycopg.Error as exc:
            raise connections.unavailable_error("commit a transaction", str(exc)) from exc

    def _run_step(
        self, connection: WatchedConnection, step_work: StepWork, run: tuple[str, str]
    ) -> tuple[RunRecord, int, str] | None:
        """The step's transaction: the new record, its version and the step's result JSON
        if it committed, None if the claim was gone."""
        run_id, attempt_id = run
        options, statements = self.options, self.statements
        watchdog = self.connections.ready_process().watchdog
        bounded = watchdog.bounded
        with contextlib.ExitStack() as pipeline:
            pipeline.enter_context(connection.pipeline())
            connection.execute("BEGIN")
            try:
                with (
                    watchdog.idle_bounded(connection, options.idle_in_transaction),
                    guarded(connection) as transaction,
                ):
                    step = step_work(transaction)
                read = connection.execute(statements.lock_run, (run_id,))
                with bounded(connection, options.call_timeout):
                    row = read.fetchone()  # Any error of the step's own statements shows here.
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                raise _HandlerError(exc) from exc
            if row is None or not decisions.holds(decode_run(row), attempt_id):
                connection.execute("ROLLBACK")
                return None
            record = steps.with_step(decode_run(row), step)  # StepError past the run's cap.
            values = encode_run(record)
            updated = connection.execute(
                statements.update_run, [*values[1:], run_id, row[len(RUN_COLUMNS)]]
            )
            connection.execute("COMMIT")
            connection.execute(RESET_SESSION)
            with bounded(connection, options.call_timeout):
                pipeline.close()  # The one Sync (see _run).
        version = updated.fetchone()
        if version is None:  # Impossible under the row lock; then nothing was written.
            raise psycopg.OperationalError(f"run {run_id} changed under its row lock")
        return record, int(version[0]), step.result_json

    def _run(
        self,
        connection: WatchedConnection,
        work: Work,
        *,
        at: datetime | None,
        keep_for: timedelta | None,
        run: tuple[str, str],
    ) -> tuple[str | None] | None:
        """The transaction; ``(result_json,)`` if it committed, None if the claim was gone."""
        run_id, attempt_id = run
        options = self.options
        process = self.connections.ready_process()
        refused: psycopg.Error | None = None
        try:
            with contextlib.ExitStack() as pipeline:
                pipeline.enter_context(connection.pipeline())
                connection.execute("BEGIN")
                try:
                    with (
                        process.watchdog.idle_bounded(connection, options.idle_in_transaction),
                        guarded(connection) as transaction,
                    ):
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
                try:  # An error may surface at any call from here: psycopg reads eagerly.
                    completion = connection.execute(self.statements.complete_held, params)
                    connection.execute("COMMIT")
                    connection.execute(RESET_SESSION)
                    # Leaving the pipeline sends its Sync and reads every result: a
                    # Pipeline.sync() before it would send a second Sync and wait for it, a
                    # round trip of its own (psycopg's BasePipeline._exit_gen). Entered on an
                    # ExitStack, the pipeline is left here, under the call's time bound.
                    with process.watchdog.bounded(connection, options.call_timeout):
                        pipeline.close()
                    completion.fetchone()
                except (psycopg.errors.DivisionByZero, psycopg.errors.PipelineAborted) as exc:
                    # The completion refused (the claim is gone), or an earlier statement of
                    # the handler's failed and the rest was skipped: the record tells which.
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
        if decisions.holds(self.get(run_id), attempt_id):
            raise _HandlerError(refused) from refused  # Then it was the handler's own statement.
        return None


def _fixed(now: Moment) -> datetime:
    return now() if callable(now) else now
