"""Faults of the emulator's own database, for its regressions."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from tasklease.emulator import CloudTasksEmulator


def fail_attempt_records(
    emulator: CloudTasksEmulator, monkeypatch: pytest.MonkeyPatch, times: int
) -> list[int]:
    """The emulator's next ``times`` writes of ended attempts raise "database is locked", as
    a locked database does; the list gets a 1 for each write that failed."""
    real = emulator.db.finish_attempts
    failures: list[int] = []

    def flaky(finishes: Any) -> None:
        if len(failures) < times:
            failures.append(1)
            raise sqlite3.OperationalError("database is locked")
        real(finishes)

    monkeypatch.setattr(emulator.db, "finish_attempts", flaky)
    return failures
