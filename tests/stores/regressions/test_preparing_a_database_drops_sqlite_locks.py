"""Making a database's files private again while SQLite has it open dropped SQLite's locks.

The check opened and closed each existing ``-wal`` / ``-shm``; closing any descriptor of a file
drops every POSIX lock the process holds on it, SQLite's included. Another process then took
itself for the only one, reset ``-shm``, and the first one's mapping of it died with SIGBUS:
the full duplicate storm lost gunicorn workers mid-handler and ran 1,017 executions for 1,000
tasks. Here a read transaction's mark must keep another process's TRUNCATE checkpoint busy
across the check.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from tasklease.plumbing.private_files import prepare_private_database

CHECKPOINT = (
    "import sqlite3, sys\n"
    "connection = sqlite3.connect(sys.argv[1])\n"
    "print(connection.execute('PRAGMA wal_checkpoint(TRUNCATE)').fetchone()[0])\n"
)


def checkpoint_is_blocked(path: Path) -> bool:
    """Whether another process's TRUNCATE checkpoint finds a reader (busy = 1)."""
    answer = subprocess.run(
        [sys.executable, "-c", CHECKPOINT, str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return answer.stdout.strip() == "1"


def test_preparing_an_open_database_again_keeps_this_processs_sqlite_locks(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    prepare_private_database(path)
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        reader.execute("PRAGMA journal_mode=WAL")
        reader.execute("CREATE TABLE t (x)")
        reader.execute("INSERT INTO t VALUES (1)")
        reader.execute("BEGIN")
        reader.execute("SELECT x FROM t").fetchall()  # Holds a read mark in -shm.
        assert checkpoint_is_blocked(path)
        prepare_private_database(path)  # As another connection of this process does.
        assert checkpoint_is_blocked(path), "the read transaction's lock was dropped"
    finally:
        reader.close()
