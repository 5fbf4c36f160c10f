"""A transactional handler's transaction on the SQLite store: the user's tables live in the
store's own database file, so the handler's writes and the run's completion record commit in
one ``BEGIN IMMEDIATE`` transaction, with one sync.

The transaction runs on the handler's own thread while no group-commit batch of the process
is in flight (:meth:`~tasklease.plumbing.group_commit.ChangeBatcher.alone`), on the process's
writing connection, under the cross-process writer lock: it holds SQLite's one write lock for
the handler's whole run, so other writers of the file (claims, renewals, its own attempt's
renewals too) wait for it. Keep transactional handlers on SQLite well within their lease:
past it the attempt reads its lease as lost by the local clock (the commit is still safe:
no other attempt can take the run over while this one holds the write lock). A
transactional step (``ctx.step(..., transactional=True)``) runs in the same kind of
transaction, which writes the step's record instead of the completion.

The handler gets the connection wrapped (:class:`SqliteTransaction`): SQLite itself can end
the transaction under it (a ``UNIQUE ON CONFLICT ROLLBACK`` column, a trigger's
``RAISE(ROLLBACK)``, SQLITE_FULL; sqlite.org/lang_conflict.html), and on a connection in
autocommit mode every later statement would then commit on its own, without the record. The
wrapper refuses a statement once the transaction has ended, and any call or statement that
would end it (:mod:`.handler_transaction`), and ``close()``: it is the process's one writing
connection, every later write of the process would fail. A ``row_factory`` or
``text_factory`` the handler sets lasts for its transaction only.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any, TypeVar

from tasklease.worker.core import decisions, steps
from tasklease.worker.core.records import RunRecord
from tasklease.worker.stores.base.handler_transaction import ends_transaction, refused
from tasklease.worker.stores.base.store import Moment, resolve
from tasklease.worker.stores.base.transactional import StepWork, TransactionOutcome, Work
from tasklease.worker.stores.sqlite import schema
from tasklease.worker.stores.sqlite.database import SqliteDatabase

__all__ = ["HandlerDatabaseError", "SqliteTransaction", "SqliteTransactions", "run_transaction"]

_T = TypeVar("_T")


class HandlerDatabaseError(Exception):
    """Carries a SQLite error the handler's own statements raised past the store's guard,
    which would otherwise report it as the store being unavailable."""

    def __init__(self, error: sqlite3.Error) -> None:
        super().__init__(str(error))
        self.error = error


def _check(connection: sqlite3.Connection, statement: str) -> None:
    if ends_transaction(statement):
        raise refused(f"the statement {statement.strip()[:40]!r}")
    if not connection.in_transaction:
        raise RuntimeError(
            "ctx.transaction has ended (SQLite rolled it back: ON CONFLICT ROLLBACK, "
            "RAISE(ROLLBACK) or a full disk): no statement runs outside it"
        )


class _GuardedCursor(sqlite3.Cursor):
    """A cursor of :class:`SqliteTransaction`: runs statements only inside the transaction."""

    def execute(self, sql: str, parameters: Any = (), /) -> _GuardedCursor:
        _check(self.connection, sql)
        return super().execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> _GuardedCursor:
        _check(self.connection, sql)
        return super().executemany(sql, seq_of_parameters)

    def executescript(self, sql_script: str, /) -> _GuardedCursor:
        raise refused("executescript() (it commits first)")


class SqliteTransaction:
    """``ctx.transaction`` on SQLite: the store's ``sqlite3.Connection`` inside ``BEGIN
    IMMEDIATE``, minus the means to end the transaction; other attributes are the
    connection's."""

    __slots__ = ("_connection",)

    def __init__(self, connection: sqlite3.Connection) -> None:
        object.__setattr__(self, "_connection", connection)

    def cursor(self) -> sqlite3.Cursor:
        cursor: _GuardedCursor = self._connection.cursor(_GuardedCursor)
        return cursor

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> sqlite3.Cursor:
        return self.cursor().executemany(sql, seq_of_parameters)

    def executescript(self, sql_script: str, /) -> sqlite3.Cursor:
        raise refused("executescript() (it commits first)")

    def commit(self) -> None:
        raise refused("commit()")

    def rollback(self) -> None:
        raise refused("rollback()")

    def close(self) -> None:
        raise refused("close() (it is the store's own connection)")

    def __enter__(self) -> None:
        raise refused("its use as a context manager (it commits on exit)")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ raised
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("isolation_level", "autocommit"):
            raise refused(f"setting {name}")
        setattr(self._connection, name, value)


def run_transaction(
    connection: sqlite3.Connection,
    work: Callable[[SqliteTransaction], _T],
    finish: Callable[[sqlite3.Connection, _T], bool],
    writer: Callable[[], AbstractContextManager[None]],
) -> tuple[bool, _T]:
    """``work`` then ``finish`` (which writes the run's record in the open transaction if the
    attempt holds the claim) in one write transaction on ``connection``, committed only if
    ``finish`` found the claim held; rolled back on any exception, which goes through.
    Returns whether it committed, and what ``work`` returned."""
    with writer():
        connection.execute("BEGIN IMMEDIATE")
        try:
            # The handler's row and text factories are its own: the store reads its rows
            # through this connection after the handler, and every later run through it.
            factories = connection.row_factory, connection.text_factory
            try:
                value = work(SqliteTransaction(connection))
            except sqlite3.Error as exc:
                raise HandlerDatabaseError(exc) from exc
            finally:
                connection.row_factory, connection.text_factory = factories
            if not connection.in_transaction:
                raise RuntimeError(
                    "ctx.transaction has ended before the handler returned (SQLite rolled it "
                    "back, or the handler ended it): the framework commits it, with the run's "
                    "completion record"
                )
            if not finish(connection, value):
                connection.execute("ROLLBACK")
                return False, value
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
    return True, value


class SqliteTransactions:
    """The transactions of a :class:`~tasklease.worker.stores.sqlite.database.SqliteDatabase`
    that hold a handler's (or a step's) writes with its run's record
    (:class:`~tasklease.worker.stores.base.transactional.TransactionalStore`'s two methods)."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._database = database

    def complete(
        self,
        run_id: str,
        attempt_id: str,
        work: Work,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> TransactionOutcome:
        """``work``'s writes and the run completed by ``attempt_id``, in one transaction."""

        def completed(record: RunRecord, result_json: str | None) -> RunRecord:
            at = resolve(now)
            return decisions.kept(decisions.completed(record, result_json, at), at, keep_for)

        held, result_json = self._in_transaction(run_id, attempt_id, work, completed)
        return TransactionOutcome(held=held, result_json=result_json if held else None)

    def record_step(self, run_id: str, attempt_id: str, step_work: StepWork) -> TransactionOutcome:
        """``step_work``'s writes and the step it returns added to the run, in one
        transaction."""
        held, step = self._in_transaction(run_id, attempt_id, step_work, steps.with_step)
        return TransactionOutcome(held=held, result_json=step.result_json if held else None)

    def _in_transaction(
        self,
        run_id: str,
        attempt_id: str,
        work: Callable[[SqliteTransaction], _T],
        change: Callable[[RunRecord, _T], RunRecord],
    ) -> tuple[bool, _T]:
        """``work``, then the run's record changed by ``change`` if ``attempt_id`` holds it."""
        database = self._database

        def finish(connection: sqlite3.Connection, value: _T) -> bool:
            row = schema.read_row(connection, run_id)
            if row is None or not decisions.holds(schema.decode_run(row), attempt_id):
                return False
            schema.write_run(connection, row, change(schema.decode_run(row), value))
            return True

        def transaction() -> tuple[bool, _T]:
            with database.guard("run a transaction"):
                return run_transaction(database.writing(), work, finish, database.writer)

        try:
            return database.alone(transaction)
        except HandlerDatabaseError as exc:  # The handler's own statement failed.
            raise exc.error from exc
