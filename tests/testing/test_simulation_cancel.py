"""The cancel workload (a run of durable steps, some fanning out children first, some waiting
between two steps, cancelled by its user before its first step, while it runs, while it waits,
long after it ended, or never): it runs clean on memory and SQLite, the same twice, and its
invariant ``ran_after_cancel`` catches the bugs planted for it (by monkeypatching tasklease,
never editing it) within a stated number of lifecycles of a stated seed, whose unplanted run
is clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasklease.testing.simulation import SimulationReport, simulate
from tasklease.testing.simulation.stores import store_factory
from tasklease.worker.core.identity import DeliveryIdentity
from tasklease.worker.delivery.cancels import Cancels
from tasklease.worker.handlers.attempt import Attempt
from tasklease.worker.stores.memory.store import MemoryStore

SEED, LIFECYCLES = 1, 60  # Every plant is caught here.


def _memory(seed: int = SEED, lifecycles: int = LIFECYCLES) -> SimulationReport:
    return simulate(
        MemoryStore, seed=seed, lifecycles=lifecycles, workload=["cancel"], store_name="memory"
    )


def _invariants(report: SimulationReport) -> set[str]:
    return {violation.invariant for violation in report.found}


def test_the_cancel_workload_runs_clean_and_the_same_twice_on_memory() -> None:
    report, again = _memory(), _memory()

    assert report.violations == (), report.violations[:3]
    assert sum(report.faults.values()) > 0
    assert again.trace_hash == report.trace_hash


def test_the_cancel_workload_runs_clean_on_sqlite(tmp_path: Path) -> None:
    report = simulate(
        store_factory("sqlite", tmp_path),
        seed=SEED,
        lifecycles=LIFECYCLES,
        workload=["cancel"],
        store_name="sqlite",
    )

    assert report.violations == (), report.violations[:3]
    assert sum(report.faults.values()) > 0


def test_a_child_that_skips_its_parents_record_runs_after_the_cancel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clean = _memory()

    def unread(self: Cancels, identity: DeliveryIdentity) -> str | None:
        """The bug: a child never reads its parent's record before its claim."""

    monkeypatch.setattr(Cancels, "cancelled_parent", unread)
    planted = _memory()

    assert clean.violations == (), clean.violations[:3]
    assert _invariants(planted) == {"ran_after_cancel"}, planted.violations[:3]
    assert any("child" in v.detail for v in planted.found)


def test_a_step_that_never_checks_the_cancellation_runs_after_the_cancel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clean = _memory()

    def unchecked(self: Attempt) -> None:
        """The bug: a step starts whatever the step writes and renewals brought back."""

    monkeypatch.setattr(Attempt, "check_cancelled", unchecked)
    planted = _memory()

    assert clean.violations == (), clean.violations[:3]
    assert _invariants(planted) == {"ran_after_cancel"}, planted.violations[:3]
