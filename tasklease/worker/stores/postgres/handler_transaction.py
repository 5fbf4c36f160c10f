"""``ctx.transaction`` on Postgres: the transaction's psycopg connection, wrapped so that the
handler cannot end the transaction (:mod:`.handler_transaction`).

psycopg's own habits would commit the handler's writes without the run's completion record:
``commit()``, ``autocommit = True``, a ``with conn:`` block, and ``COMMIT`` sent as SQL: each
is refused before it reaches the server, by the wrapper or by the cursors it makes. And
``with conn.transaction():`` at the handler's top level: psycopg opens an outer transaction
(``BEGIN`` ... ``COMMIT``) when libpq reports the connection idle, which in pipeline mode it
does inside a transaction too (the status comes with ReadyForQuery, only after a Sync;
postgresql.org/docs/current/libpq-pipeline-mode.html): the wrapper's ``transaction()`` is
always a savepoint.

The connection's transaction status is unreliable in pipeline mode for the same reason, so
nothing here reads it: the wrapper's refusals are what keep the transaction open, and the
wrapper says so itself (``in_transaction``, True until the handler's block ends).

For the same reason the server never sees the transaction idle (its
``idle_in_transaction_session_timeout`` counts from a ReadyForQuery, which only a Sync
brings): the caller bounds the handler's idle time itself (:meth:`.Watchdog.idle_bounded`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from psycopg import Connection, Cursor, Transaction, pq, sql

from tasklease.worker.stores.base.handler_transaction import ends_transaction, refused

__all__ = ["PostgresTransaction", "guarded"]

_ENDING = frozenset(
    (
        "commit",
        "rollback",
        "set_autocommit",
        "tpc_begin",
        "tpc_prepare",
        "tpc_commit",
        "tpc_rollback",
    )
)


def _check(connection: Connection[Any], query: Any) -> None:
    text = query.as_string(connection) if isinstance(query, sql.Composable) else query
    if isinstance(text, str | bytes) and ends_transaction(text):
        raise refused(f"the statement {text[:40]!r}")


class _GuardedCursor(Cursor[Any]):
    """A cursor of :class:`PostgresTransaction`: no statement that ends the transaction."""

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        _check(self.connection, query)
        return super().execute(query, *args, **kwargs)

    def executemany(self, query: Any, *args: Any, **kwargs: Any) -> None:
        _check(self.connection, query)
        super().executemany(query, *args, **kwargs)


class _Savepoint(Transaction):
    """A psycopg ``Transaction`` that is never the outer one."""

    def _push_savepoint(self) -> None:
        # psycopg's own (psycopg/transaction.py) for a nested transaction, whatever the
        # status libpq reports: the framework's BEGIN is the outer one.
        # The connection's count of open transactions is psycopg's private state too.
        self._outer_transaction = False
        depth = self._conn._num_transactions  # noqa: SLF001 - see the comment above.
        if not self._savepoint_name:
            self._savepoint_name = f"_pg3_{depth + 1}"
        self._stack_index = depth
        self._conn._num_transactions = depth + 1  # noqa: SLF001 - see the comment above.


class _Block:
    """Whether the handler's block of :func:`guarded` is still running."""

    __slots__ = ("running",)

    def __init__(self) -> None:
        self.running = True


class PostgresTransaction:
    """The handler's view of the transaction's ``psycopg.Connection``: other attributes are
    the connection's."""

    __slots__ = ("_block", "_connection")
    _block: _Block
    _connection: Connection[Any]

    def __init__(self, connection: Connection[Any], block: _Block) -> None:
        object.__setattr__(self, "_connection", connection)
        object.__setattr__(self, "_block", block)

    @property
    def in_transaction(self) -> bool:
        """True while the handler runs: the framework's transaction is open and only the
        framework ends it (as ``sqlite3.Connection.in_transaction``; libpq's own status
        cannot tell in pipeline mode). False once the handler's block is over."""
        return self._block.running

    @contextmanager
    def transaction(
        self, savepoint_name: str | None = None, force_rollback: bool = False
    ) -> Iterator[Transaction]:
        """psycopg's ``Connection.transaction()``, always as a savepoint."""
        connection = self._connection
        savepoint = _Savepoint(connection, savepoint_name, force_rollback)
        if connection.pgconn.pipeline_status != pq.PipelineStatus.OFF:  # As psycopg's own.
            with connection.pipeline(), savepoint, connection.pipeline():
                yield savepoint
        else:
            with savepoint:
                yield savepoint

    def __enter__(self) -> None:
        raise refused("its use as a context manager (it commits on exit)")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ raised
        return None

    def close(self) -> None:
        raise refused("close() (it is the store's pooled connection)")

    def __getattr__(self, name: str) -> Any:
        if name in _ENDING:
            raise refused(f"{name}()")
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "autocommit":
            raise refused("setting autocommit")
        setattr(self._connection, name, value)


@contextmanager
def guarded(connection: Connection[Any]) -> Iterator[PostgresTransaction]:
    """``connection`` for the handler, its cursors guarded until the block ends. A
    ``row_factory`` the handler sets (psycopg's
    ``dict_row``) lasts until then too: the store reads its own rows through the connection
    after the handler, and so does every later user of the pooled connection."""
    factory, rows = connection.cursor_factory, connection.row_factory
    connection.cursor_factory = _GuardedCursor
    block = _Block()
    try:
        yield PostgresTransaction(connection, block)
    finally:
        block.running = False
        connection.cursor_factory, connection.row_factory = factory, rows
