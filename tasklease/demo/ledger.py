"""A ledger of side effects (emails "sent"), so the demo and tests can count them.

Every handler of the example shop writes one row per side effect it performs. If tasklease
ever ran a handler twice for one run, the ledger would show two rows for its key.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tasklease.worker import TaskContext


class Ledger:
    """Rows of (kind, key, run_id, fencing_token) in a SQLite file shared by processes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._local = threading.local()

    def record(self, kind: str, key: str, ctx: TaskContext) -> None:
        """Perform (and log) one side effect."""
        with self._connection() as connection:
            connection.execute(
                "INSERT INTO side_effects (kind, key, run_id, fencing_token) VALUES (?, ?, ?, ?)",
                (kind, key, ctx.run_id, ctx.fencing_token),
            )

    @contextmanager
    def exclusive(self, kind: str, key: str) -> Iterator[None]:
        """Mark ``kind:key`` as running for the ``with`` block; if it already was (two
        executions overlapping), record an ``overlap`` side effect, which the demo reports."""
        with self._connection() as connection:
            try:
                connection.execute("INSERT INTO running (item) VALUES (?)", (f"{kind}:{key}",))
                mine = True
            except sqlite3.IntegrityError:
                connection.execute(
                    "INSERT INTO side_effects (kind, key) VALUES ('overlap', ?)", (f"{kind}:{key}",)
                )
                mine = False
        try:
            yield
        finally:
            if mine:
                with self._connection() as connection:
                    connection.execute("DELETE FROM running WHERE item = ?", (f"{kind}:{key}",))

    def counts(self, kind: str | None = None) -> Counter[str]:
        """How many times each key's side effect happened."""
        query = "SELECT kind || ':' || key FROM side_effects"
        params: tuple[str, ...] = ()
        if kind is not None:
            query += " WHERE kind = ?"
            params = (kind,)
        rows = self._connection().execute(query, params).fetchall()
        return Counter(row[0] for row in rows)

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None or getattr(self._local, "pid", None) != os.getpid():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, timeout=30)
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute(
                "CREATE TABLE IF NOT EXISTS side_effects (kind TEXT, key TEXT, run_id TEXT, "
                "fencing_token INTEGER, at TEXT DEFAULT CURRENT_TIMESTAMP)"
            )
            connection.execute("CREATE TABLE IF NOT EXISTS running (item TEXT PRIMARY KEY)")
            self._local.connection, self._local.pid = connection, os.getpid()
        return connection
