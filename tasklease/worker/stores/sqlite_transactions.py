"""A transactional handler's transaction on the SQLite store: the user's tables live in the
store's own database file, so the handler's writes and the run's completion record commit in
one ``BEGIN IMMEDIATE`` transaction, with one sync.

The transaction runs on the handler's own thread while no group-commit batch of the process
is in flight (:meth:`~tasklease.plumbing.group_commit.GroupCommit.alone`), on the process's
writing connection, under the cross-process writer lock: it holds SQLite's one write lock for
the handler's whole run, so other writers of the file (claims, renewals, its own attempt's
renewals too) wait for it. Keep transactional handlers on SQLite well within their lease:
past it the attempt reads its lease as lost by the local clock (the commit is still safe:
no other attempt can take the run over while this one holds the write lock). A
transactional step (``ctx.step(..., transactional=True)``) runs in the same kind of
transaction, which writes the step's record instead of the completion.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TypeVar

__all__ = ["HandlerDatabaseError", "run_transaction"]

_T = TypeVar("_T")


class HandlerDatabaseError(Exception):
    """Carries a SQLite error the handler's own statements raised past the store's guard,
    which would otherwise report it as the store being unavailable."""

    def __init__(self, error: sqlite3.Error) -> None:
        super().__init__(str(error))
        self.error = error


def run_transaction(
    connection: sqlite3.Connection,
    work: Callable[[sqlite3.Connection], _T],
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
            try:
                value = work(connection)
            except sqlite3.Error as exc:
                raise HandlerDatabaseError(exc) from exc
            if not connection.in_transaction:
                raise RuntimeError(
                    "the handler ended ctx.transaction itself (COMMIT or ROLLBACK): the "
                    "framework commits it, with the run's completion record"
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
