"""Scheduler runs waiting for a retry, kept in the emulator's database so that a restart
resumes them (at their retry time, with their schedule time and attempt count) instead of
dropping them. A run is written when an attempt fails and a retry is owed, and removed when
the run ends (an attempt succeeds, or the retry policy gives up)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tasklease.emulator.db import EmulatorDB

_log = logging.getLogger("tasklease.scheduler")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS scheduler_retries (
    run_id TEXT PRIMARY KEY,
    job TEXT NOT NULL,
    schedule_us INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    first_us INTEGER NOT NULL,
    next_us INTEGER NOT NULL
)
"""


@dataclass(frozen=True)
class PendingRun:
    """A run of ``job`` for ``schedule_us`` whose ``attempt`` attempts failed (the first at
    ``first_us``); its next attempt is due at ``next_us``. Times in µs since the epoch."""

    run_id: str
    job: str
    schedule_us: int
    attempt: int
    first_us: int
    next_us: int


class PendingRuns:
    """The ``scheduler_retries`` table of an :class:`EmulatorDB`."""

    def __init__(self, db: EmulatorDB) -> None:
        self._db = db
        with db.transaction() as connection:
            connection.execute(_SCHEMA)

    def owe(self, run: PendingRun) -> None:
        """Remember that ``run`` is owed its next attempt (replacing what was kept of it)."""
        try:
            with self._db.transaction() as connection:
                connection.execute(
                    "INSERT OR REPLACE INTO scheduler_retries VALUES (?, ?, ?, ?, ?, ?)",
                    (run.run_id, run.job, run.schedule_us, run.attempt, run.first_us, run.next_us),
                )
        except Exception:  # The run goes on in memory; only a restart would lose it.
            _log.exception("could not keep the retry of %s", run.job)

    def done(self, run_id: str) -> None:
        """The run ended: nothing more is owed."""
        try:
            with self._db.transaction() as connection:
                connection.execute("DELETE FROM scheduler_retries WHERE run_id = ?", (run_id,))
        except Exception:  # At worst a restart sends one more attempt of a finished run.
            _log.exception("could not forget the finished run %s", run_id)

    def all(self) -> list[PendingRun]:
        with self._db.transaction() as connection:
            rows = connection.execute(
                "SELECT run_id, job, schedule_us, attempt, first_us, next_us "
                "FROM scheduler_retries ORDER BY next_us"
            ).fetchall()
        return [PendingRun(*row) for row in rows]
