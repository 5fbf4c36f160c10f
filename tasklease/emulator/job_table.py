"""The Cloud Scheduler jobs the API created, in the emulator's database (REST JSON specs).

Every change reads and writes its job in one transaction: a run's result recorded while the
job is deleted never brings the job back, and an update and a run's result, or two updates,
never lose one another."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tasklease.emulator.db import EmulatorDB

Spec = dict[str, Any]


class JobTable:
    """The ``scheduler_jobs`` table of an :class:`EmulatorDB`."""

    def __init__(self, db: EmulatorDB) -> None:
        self._db = db

    def get(self, name: str) -> Spec | None:
        with self._db.transaction() as connection:
            row = connection.execute(
                "SELECT spec FROM scheduler_jobs WHERE name = ?", (name,)
            ).fetchone()
        return json.loads(row[0]) if row else None

    def list(self, prefix: str) -> list[Spec]:
        """Jobs whose name starts with ``prefix``, by name."""
        with self._db.transaction() as connection:
            rows = connection.execute("SELECT name, spec FROM scheduler_jobs ORDER BY name")
            return [json.loads(spec) for name, spec in rows if name.startswith(prefix)]

    def create(self, name: str, spec: Spec) -> bool:
        """Store a new job; False (and nothing changed) if ``name`` exists."""
        with self._db.transaction() as connection:
            cursor = connection.execute(
                "INSERT OR IGNORE INTO scheduler_jobs (name, spec) VALUES (?, ?)",
                (name, json.dumps(spec)),
            )
            return cursor.rowcount == 1

    def change(self, name: str, change: Callable[[Spec], Spec]) -> Spec | None:
        """Replace job ``name`` with ``change(current)``, atomically; None if there is none
        (then ``change`` is not called). An exception from ``change`` changes nothing."""
        with self._db.transaction() as connection:
            row = connection.execute(
                "SELECT spec FROM scheduler_jobs WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                return None
            spec = change(json.loads(row[0]))
            connection.execute(
                "UPDATE scheduler_jobs SET spec = ? WHERE name = ?", (json.dumps(spec), name)
            )
            return spec

    def put(self, name: str, spec: Spec) -> None:
        """Store ``spec`` as job ``name``, whether or not it exists (tests, restores)."""
        with self._db.transaction() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO scheduler_jobs (name, spec) VALUES (?, ?)",
                (name, json.dumps(spec)),
            )

    def delete(self, name: str) -> bool:
        """Delete job ``name``; False if there was none."""
        with self._db.transaction() as connection:
            cursor = connection.execute("DELETE FROM scheduler_jobs WHERE name = ?", (name,))
            return cursor.rowcount == 1
