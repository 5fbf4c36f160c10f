"""Fixtures of the fault suite: the reduced scale by default, ``TASKLEASE_FAULTS=full`` for
``make faults``; each scenario prints its counts line."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.harness import FULL, Tally

REPORT_FILE = os.environ.get("TASKLEASE_FAULTS_REPORT")


@pytest.fixture
def report(capsys: pytest.CaptureFixture[str]) -> Callable[[str, Tally], None]:
    """Print a scenario's counts line (past pytest's capture), and append it to
    ``TASKLEASE_FAULTS_REPORT`` if set."""

    def emit(name: str, counts: Tally) -> None:
        line = counts.line(f"{name}{'' if FULL else ' (reduced)'}")
        with capsys.disabled():
            print(f"\n{line}")
        if REPORT_FILE:
            with Path(REPORT_FILE).open("a") as out:
                out.write(line + "\n")

    return emit
