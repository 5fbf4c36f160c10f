"""What a transactional handler may not do with ``ctx.transaction``: end the transaction.

The framework commits it, with the run's completion record, only if the attempt still holds
the claim. A write committed any other way is kept without the record, and the retry applies
it again. So the stores' wrappers refuse, before it reaches the database, every call and
statement that would end it: ``commit()``, ``rollback()``, autocommit, and SQL that begins,
commits or rolls back a transaction (a ``ROLLBACK TO`` a savepoint is fine).
"""

from __future__ import annotations

import re

__all__ = ["ends_transaction", "refused"]

# A statement's first keyword, after blanks, comments and empty statements (both databases
# skip a leading ";"). SQLite: BEGIN, COMMIT, END, ROLLBACK
# (sqlite.org/lang_transaction.html); Postgres also START TRANSACTION, ABORT and PREPARE
# TRANSACTION (postgresql.org/docs/current/sql-commands.html).
_CONTROL = re.compile(
    r"(?:\s|;|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*"
    r"(?:begin|start|commit|end|abort|prepare\s+transaction"
    r"|rollback(?!(?:\s+(?:work|transaction))?\s+to\b))\b",
    re.IGNORECASE | re.DOTALL,
)


def ends_transaction(statement: str | bytes) -> bool:
    """Whether ``statement`` begins, commits or rolls back a transaction."""
    text = statement.decode("utf-8", "replace") if isinstance(statement, bytes) else statement
    return _CONTROL.match(text) is not None


def refused(what: str) -> RuntimeError:
    """The error a handler gets for trying to end its transaction with ``what``."""
    return RuntimeError(
        f"ctx.transaction refuses {what}: the framework commits the transaction with the "
        "run's completion record; raise from the handler to roll it back"
    )
