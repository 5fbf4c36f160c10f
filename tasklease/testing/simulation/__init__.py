"""A seeded simulation of Cloud Tasks, Cloud Scheduler, worker instances and a store, driving
the real delivery protocol (router, executor, lease renewals, store) on virtual time under
faults drawn from the seed, and an independent checker of the history it leaves.

    report = simulate(MemoryStore, seed=7, lifecycles=2000)
    assert not report.violations, report.violations[0]

``tasklease simulate --store sqlite --seed 7 --lifecycles 2000`` runs the same from a shell.
"""

from __future__ import annotations

from tasklease.testing.simulation.checker import INVARIANTS, HistoryViolation, check
from tasklease.testing.simulation.faults import FAULT_KINDS, FaultPlan
from tasklease.testing.simulation.history import History
from tasklease.testing.simulation.run import SimulationReport, simulate
from tasklease.testing.simulation.workload import WORKLOAD_KINDS, Workload

__all__ = [
    "FAULT_KINDS",
    "INVARIANTS",
    "WORKLOAD_KINDS",
    "FaultPlan",
    "History",
    "HistoryViolation",
    "SimulationReport",
    "Workload",
    "check",
    "simulate",
]
