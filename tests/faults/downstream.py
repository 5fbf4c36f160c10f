"""The downstream system the fault scenarios' handlers write to: a SQLite file that honours
fencing tokens, and records every handler execution so the tests can count and compare them.

A write for a business key carries the attempt's ``ctx.fencing_token``. In one transaction it
is refused if a higher token already wrote that key (a stale attempt whose lease was taken
over), applied if the key has no effect yet, and otherwise acknowledged as already applied (a
retry after a crash between the side effect and the completion record). So each key's effect
exists at most once, whatever the worker does; the counts show what the worker did.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tasklease.worker import TaskContext

APPLIED = "applied"
ALREADY_APPLIED = "already_applied"
REFUSED = "refused"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    attempt_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, key TEXT NOT NULL,
    fencing_token INTEGER NOT NULL, pid INTEGER NOT NULL, revision TEXT NOT NULL,
    started REAL NOT NULL, ended REAL, verdict TEXT, past_lease INTEGER NOT NULL DEFAULT 0,
    live_until REAL
);
CREATE TABLE IF NOT EXISTS fences (key TEXT PRIMARY KEY, fencing_token INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS effects (
    key TEXT PRIMARY KEY, run_id TEXT NOT NULL, attempt_id TEXT NOT NULL,
    fencing_token INTEGER NOT NULL, at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS writes (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL, attempt_id TEXT NOT NULL,
    fencing_token INTEGER NOT NULL, verdict TEXT NOT NULL, at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class Execution:
    """One entry into a handler, with its wall-clock interval (``ended`` None: it never
    returned, e.g. its process was killed)."""

    attempt_id: str
    run_id: str
    key: str
    fencing_token: int
    pid: int
    revision: str
    started: float
    ended: float | None
    verdict: str | None
    past_lease: int  # Lease checks that passed although the attempt's lease had expired.
    live_until: float | None  # When its last lease check passed (or its write was made).

    def active_until(self, killed_at: float | None = None) -> float:
        """When this execution last did, or was entitled to do, anything that matters.

        A handler that stopped on LeaseLost (or a refused write) made no progress after its
        last passed lease check: it was only on its way out. One whose process was killed
        counts until the kill (for ever if it was not killed).
        """
        if self.ended is None:
            return float("inf") if killed_at is None else killed_at
        if self.verdict in (APPLIED, ALREADY_APPLIED) or self.live_until is None:
            return self.ended
        return self.live_until


class Downstream:
    """The fenced downstream store, shared by every worker process and the test."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._local = threading.local()

    # Written by handlers.

    def started(self, key: str, ctx: TaskContext) -> None:
        """Record entry into the handler (real wall time: never the worker's skewed clock)."""
        with self._transaction() as db:
            db.execute(
                "INSERT INTO executions (attempt_id, run_id, key, fencing_token, pid, revision, "
                "started) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    ctx.attempt_id,
                    ctx.run_id,
                    key,
                    ctx.fencing_token,
                    os.getpid(),
                    os.environ.get("TASKLEASE_FAULTS_REVISION", "r1"),
                    time.time(),
                ),
            )

    def write(self, key: str, ctx: TaskContext) -> str:
        """The side effect for ``key``, fenced by ``ctx.fencing_token``; returns its verdict."""
        with self._transaction() as db:
            row = db.execute("SELECT fencing_token FROM fences WHERE key = ?", (key,)).fetchone()
            if row is not None and row[0] > ctx.fencing_token:
                verdict = REFUSED
            else:
                db.execute(
                    "INSERT OR REPLACE INTO fences (key, fencing_token) VALUES (?, ?)",
                    (key, ctx.fencing_token),
                )
                exists = db.execute("SELECT 1 FROM effects WHERE key = ?", (key,)).fetchone()
                verdict = ALREADY_APPLIED if exists else APPLIED
                if not exists:
                    db.execute(
                        "INSERT INTO effects (key, run_id, attempt_id, fencing_token, at) "
                        "VALUES (?, ?, ?, ?, ?)",
                        (key, ctx.run_id, ctx.attempt_id, ctx.fencing_token, time.time()),
                    )
            db.execute(
                "INSERT INTO writes (key, attempt_id, fencing_token, verdict, at) "
                "VALUES (?, ?, ?, ?, ?)",
                (key, ctx.attempt_id, ctx.fencing_token, verdict, time.time()),
            )
        return verdict

    def ended(
        self, ctx: TaskContext, verdict: str, past_lease: int = 0, live_until: float | None = None
    ) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE executions SET ended = ?, verdict = ?, past_lease = ?, live_until = ? "
                "WHERE attempt_id = ?",
                (time.time(), verdict, past_lease, live_until, ctx.attempt_id),
            )

    # Read by the tests.

    def executions(self) -> list[Execution]:
        rows = self._connection().execute(
            "SELECT attempt_id, run_id, key, fencing_token, pid, revision, started, ended, "
            "verdict, past_lease, live_until FROM executions ORDER BY started"
        )
        return [Execution(*row) for row in rows]

    def effects(self) -> Counter[str]:
        """How many effects each key has (at most 1 by construction: a missing key is lost)."""
        return Counter(row[0] for row in self._connection().execute("SELECT key FROM effects"))

    def writes(self) -> Counter[str]:
        """Write attempts by verdict."""
        rows = self._connection().execute("SELECT verdict, COUNT(*) FROM writes GROUP BY verdict")
        return Counter({verdict: count for verdict, count in rows})

    def refused_attempts(self) -> set[str]:
        rows = self._connection().execute(
            "SELECT attempt_id FROM writes WHERE verdict = ?", (REFUSED,)
        )
        return {row[0] for row in rows}

    def _transaction(self) -> _Transaction:
        return _Transaction(self._connection())

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None or getattr(self._local, "pid", None) != os.getpid():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            connection.execute("PRAGMA busy_timeout = 60000")
            for attempt in range(100):  # Several processes may open a fresh file at once.
                try:
                    connection.execute("PRAGMA journal_mode = WAL")
                    connection.executescript(_SCHEMA)
                    break
                except sqlite3.OperationalError:
                    if attempt == 99:
                        raise
                    time.sleep(0.05)
            self._local.connection, self._local.pid = connection, os.getpid()
        return connection


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``: the write lock is taken before the fence is read."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def __enter__(self) -> sqlite3.Connection:
        self._connection.execute("BEGIN IMMEDIATE")
        return self._connection

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        if kind is None:
            self._connection.execute("COMMIT")
        else:
            self._connection.execute("ROLLBACK")
