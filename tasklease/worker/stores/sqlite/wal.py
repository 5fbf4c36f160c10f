"""Putting the SQLite store's file in WAL mode (a persistent setting of the file)."""

from __future__ import annotations

import sqlite3
import time
from datetime import timedelta
from pathlib import Path

from tasklease.errors import StoreUnavailable

__all__ = ["start_in_wal_mode", "use_wal"]


def start_in_wal_mode(path: Path) -> None:
    """Make ``path`` a database already in WAL mode, before any other process can see it."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode = WAL")
    finally:
        connection.close()


def use_wal(connection: sqlite3.Connection, path: Path, busy_timeout: timedelta) -> None:
    """Switch the file to WAL (a persistent setting), retrying while others hold it.

    Switching needs the file alone, and SQLite can answer "database is locked" at once
    there instead of waiting for busy_timeout: seen when several gunicorn workers open a
    fresh file together (tests/stores/test_store_sqlite_open.py).
    """
    deadline = time.monotonic() + busy_timeout.total_seconds()
    pause = 0.005
    while True:
        try:
            if connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                return
            if connection.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
        if time.monotonic() > deadline:
            raise StoreUnavailable(f"{path}: could not switch to WAL mode: file busy")
        time.sleep(pause)
        pause = min(pause * 2, 0.2)
