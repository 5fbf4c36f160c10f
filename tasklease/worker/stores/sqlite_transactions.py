"""A transactional handler's transaction on the SQLite store: the user's tables live in the
store's own database file, so the handler's writes and the run's completion record commit in
one ``BEGIN IMMEDIATE`` transaction, with one sync.

The transaction runs on the handler's own thread while no group-commit batch of the process
is in flight (:meth:`~tasklease.plumbing.group_commit.GroupCommit.alone`), on the process's
writing connection, under the cross-process writer lock: it holds SQLite's one write lock for
the handler's whole run, so other writers of the file (claims, renewals, its own attempt's
renewals too) wait for it. Keep transactional handlers on SQLite well within their lease:
past it the attempt reads its lease as lost by the local clock (the commit is still safe:
no other attempt can take the run over while this one holds the write lock).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager

from tasklease.worker.stores.transactional import TransactionOutcome, Work

__all__ = ["HandlerDatabaseError", "run_transaction"]

Finish = Callable[[sqlite3.Connection, str | None], bool]
"""Writes the completion record in the open transaction if the attempt holds the claim."""


class HandlerDatabaseError(Exception):
    """Carries a SQLite error the handler's own statements raised past the store's guard,
    which would otherwise report it as the store being unavailable."""

    def __init__(self, error: sqlite3.Error) -> None:
        super().__init__(str(error))
        self.error = error


def run_transaction(
    connection: sqlite3.Connection,
    work: Work,
    finish: Finish,
    writer: Callable[[], AbstractContextManager[None]],
) -> TransactionOutcome:
    """``work`` then ``finish`` in one write transaction on ``connection``, committed only if
    ``finish`` found the claim held; rolled back on any exception, which goes through."""
    with writer():
        connection.execute("BEGIN IMMEDIATE")
        try:
            try:
                result_json = work(connection)
            except sqlite3.Error as exc:
                raise HandlerDatabaseError(exc) from exc
            if not connection.in_transaction:
                raise RuntimeError(
                    "the handler ended ctx.transaction itself (COMMIT or ROLLBACK): the "
                    "framework commits it, with the run's completion record"
                )
            if not finish(connection, result_json):
                connection.execute("ROLLBACK")
                return TransactionOutcome(held=False, result_json=None)
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
    return TransactionOutcome(held=True, result_json=result_json)
