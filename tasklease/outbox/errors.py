"""What the outbox raises: below every module that stages, so each can refuse a transaction."""

from __future__ import annotations

from tasklease.errors import TaskleaseError

__all__ = ["NotInTransaction"]


class NotInTransaction(TaskleaseError, ValueError):
    """The transaction object given would commit the entry on its own (autocommit), or is no
    transaction in progress. A ValueError too, as it was before it joined tasklease's tree."""
