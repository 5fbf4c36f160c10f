"""Write outbox entries through the caller's own transaction, whatever kind it is.

Supported: ``sqlite3.Connection`` inside a transaction; psycopg 3 ``Connection`` that is not
in autocommit mode (or is inside ``conn.transaction()``, or in pipeline mode); SQLAlchemy
``Connection`` or ``Session`` inside a transaction; a Firestore ``Transaction`` in progress
(:mod:`tasklease.outbox.firestore`); a Spanner ``Transaction`` inside
``database.run_in_transaction`` (:mod:`tasklease.outbox.spanner`). Django's raw
``connection.connection`` inside ``transaction.atomic()`` is one of the first two. A connection
that would autocommit the insert is refused: the entry must exist exactly when the caller's
transaction commits.
psycopg and SQLAlchemy are detected by duck typing, never imported unless the caller uses them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from tasklease.outbox import wake
from tasklease.outbox.entries import CHANNEL, COLUMNS, TABLE, Entry
from tasklease.outbox.errors import NotInTransaction

SUPPORTED = (
    "sqlite3.Connection (in a transaction), psycopg.Connection (not autocommit), "
    "sqlalchemy Connection or Session (in a transaction), "
    "google.cloud.firestore Transaction (in @firestore.transactional), "
    "google.cloud.spanner_v1 Transaction (in database.run_in_transaction)"
)


# A transactional handler's ``ctx.transaction`` on the SQL stores: the driver's connection,
# wrapped; on Spanner and Firestore, the client's transaction, wrapped (named here so as to
# import nothing of the worker).
_HANDLER_TRANSACTIONS = {
    "tasklease.worker.stores.sqlite.transactions.SqliteTransaction": "sqlite3",
    "tasklease.worker.stores.postgres.handler_transaction.PostgresTransaction": "psycopg",
    "tasklease.worker.stores.base.google_handler_transaction.GoogleTransaction": "google",
}


def _insert(placeholder: Callable[[str], str]) -> str:
    values = ", ".join(placeholder(column) for column in COLUMNS)
    return (
        f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES ({values}) ON CONFLICT (id) DO NOTHING"
    )


_NAMED = _insert(lambda column: f":{column}")  # sqlite3 and SQLAlchemy text()
# psycopg: RETURNING, as a pipeline's rowcount is not known until its result arrives.
_PYFORMAT = _insert(lambda column: f"%({column})s") + " RETURNING id"


def stage(tx: Any, entries: Sequence[Entry]) -> list[bool]:
    """Insert ``entries`` through ``tx``; True for each that is new (False: already staged)."""
    handler_transaction = _HANDLER_TRANSACTIONS.get(f"{type(tx).__module__}.{type(tx).__name__}")
    if handler_transaction == "google":  # Staging writes through it, never ends it.
        tx = tx.wrapped
    if isinstance(tx, sqlite3.Connection) or handler_transaction == "sqlite3":
        return _sqlite(tx, entries)
    if handler_transaction == "psycopg":
        # Its own word, not libpq's: the status libpq reports is stale in pipeline mode.
        if not tx.in_transaction:
            raise NotInTransaction(
                "this ctx.transaction belongs to a transactional handler that has returned: "
                "its transaction is over; stage entries from inside the handler"
            )
        return _psycopg(tx, entries, trusted=True)
    module = type(tx).__module__
    if type(tx).__name__.startswith("Async"):
        raise TypeError(
            f"transaction= got a {type(tx).__qualname__}: async connections are not supported; "
            f"supported: {SUPPORTED}"
        )
    if module.startswith("psycopg.") or module == "psycopg":
        return _psycopg(tx, entries)
    if module.startswith("sqlalchemy."):
        return _sqlalchemy(tx, entries)
    if module.startswith("google.cloud.firestore") and type(tx).__name__ == "Transaction":
        from tasklease.outbox import firestore  # noqa: PLC0415 - the caller's own Firestore.

        return firestore.stage(tx, entries)
    if module == "google.cloud.spanner_v1.transaction" and type(tx).__name__ == "Transaction":
        from tasklease.outbox import spanner  # noqa: PLC0415 - the caller's own Spanner.

        return spanner.stage(tx, entries)
    raise TypeError(f"transaction= got a {type(tx).__qualname__}; supported: {SUPPORTED}")


def _sqlite(conn: sqlite3.Connection, entries: Sequence[Entry]) -> list[bool]:
    if not conn.in_transaction:
        raise NotInTransaction(
            "the sqlite3 connection is not in a transaction: the outbox entry would be "
            "committed on its own; write your own rows first, or execute BEGIN"
        )
    return [conn.execute(_NAMED, entry.row()).rowcount == 1 for entry in entries]


def _psycopg(conn: Any, entries: Sequence[Entry], *, trusted: bool = False) -> list[bool]:
    if not trusted and conn.autocommit and _outside_transaction(conn):
        raise NotInTransaction(
            "the psycopg connection is in autocommit mode: the outbox entry would be committed "
            "on its own; use it inside `with conn.transaction():` or with autocommit=False"
        )
    staged = []
    with conn.cursor() as cursor:
        for entry in entries:
            cursor.execute(_PYFORMAT, entry.row())
            staged.append(cursor.fetchone() is not None)  # No row: staged before.
        # Delivered to LISTENers only if, and when, this transaction commits.
        cursor.execute(f"NOTIFY {CHANNEL}")
    return staged


def _outside_transaction(conn: Any) -> bool:
    """Whether an autocommit psycopg connection would commit a statement on its own."""
    from psycopg import pq  # noqa: PLC0415 - the caller's own psycopg.

    if conn.pgconn.pipeline_status != pq.PipelineStatus.OFF:
        # In pipeline mode the statements up to the next Sync run as one transaction
        # (implicit, or the caller's BEGIN), so the entry commits with them; and libpq's
        # status is the one of the last Sync, stale until the next one
        # (postgresql.org/docs/current/protocol-flow.html#PROTOCOL-FLOW-PIPELINING).
        return False
    return bool(conn.info.transaction_status == pq.TransactionStatus.IDLE)


def _sqlalchemy(tx: Any, entries: Sequence[Entry]) -> list[bool]:
    if not callable(getattr(tx, "in_transaction", None)) or not tx.in_transaction():
        raise NotInTransaction(
            f"the SQLAlchemy {type(tx).__name__} is not in a transaction: use it inside "
            "`with engine.begin() as conn:` or `with session.begin():`"
        )
    session = hasattr(tx, "get_bind")
    conn = tx.connection() if session else tx  # A Session: its connection.
    raw = conn.connection.dbapi_connection
    autocommit = (
        # sqlite3's autocommit mode, unless a BEGIN was executed (SQLAlchemy's recipe for
        # real SQLite transactions emits it on the "begin" event; its SQLite dialect docs).
        raw.isolation_level is None and not raw.in_transaction
        if isinstance(raw, sqlite3.Connection)
        else getattr(raw, "autocommit", False) is True
    )
    if autocommit:
        raise NotInTransaction(
            "the SQLAlchemy connection runs with AUTOCOMMIT isolation: the outbox entry would "
            "be committed on its own"
        )
    from sqlalchemy import text  # noqa: PLC0415 - the caller's own SQLAlchemy.

    insert = text(_NAMED)
    staged = [conn.execute(insert, entry.row()).rowcount == 1 for entry in entries]
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"NOTIFY {CHANNEL}"))
    if session:
        from sqlalchemy import event  # noqa: PLC0415

        # After the commit (not before, as a Connection's "commit" event is): the fast path.
        event.listen(tx, "after_commit", wake.nudge, once=True)
    return staged
