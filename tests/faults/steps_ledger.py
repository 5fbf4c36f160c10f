"""The downstream of the durable-steps scenario: a SQLite file that applies each step's effect
once per step key (as a downstream API honouring ``request_id`` does) and logs every call of
a step's function, so a test can tell a step re-executed after its record."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path


class StepsLedger:
    def __init__(self, path: str | Path) -> None:
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS effects (step_key TEXT PRIMARY KEY, run_id TEXT, "
            "step TEXT, attempt_id TEXT)"
        )
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS calls (run_id TEXT, step TEXT, attempt_id TEXT, "
            "at REAL, pid INTEGER, seq INTEGER PRIMARY KEY AUTOINCREMENT)"
        )

    def called(self, run_id: str, step: str, attempt_id: str) -> None:
        """Log a call of a step's function, before it does anything."""
        self._db.execute(
            "INSERT INTO calls (run_id, step, attempt_id, at, pid) VALUES (?, ?, ?, ?, ?)",
            (run_id, step, attempt_id, time.time(), os.getpid()),
        )

    def apply(self, run_id: str, step: str, attempt_id: str, step_key: str) -> bool:
        """Apply the effect unless its key was applied: True if applied."""
        cursor = self._db.execute(
            "INSERT OR IGNORE INTO effects VALUES (?, ?, ?, ?)",
            (step_key, run_id, step, attempt_id),
        )
        return cursor.rowcount == 1

    def effects(self) -> list[tuple[str, str, str]]:
        return list(self._db.execute("SELECT run_id, step, attempt_id FROM effects"))

    def calls(self) -> list[tuple[str, str, str]]:
        return list(self._db.execute("SELECT run_id, step, attempt_id FROM calls ORDER BY seq"))

    def pids(self) -> list[int]:
        return [row[0] for row in self._db.execute("SELECT pid FROM calls ORDER BY seq")]
