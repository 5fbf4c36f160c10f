"""The outbox, durable-step, continuation and fan-out workloads: each runs clean (the outbox
on every database it has, the same trace twice), and each of their invariants catches the bug
planted for it (by monkeypatching tasklease, never editing it) within a stated number of
lifecycles of a stated seed, whose unplanted run is clean."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tasklease.outbox import adapters
from tasklease.outbox.db import PostgresOutbox, SQLiteOutbox
from tasklease.outbox.entries import Entry, Undecodable
from tasklease.testing.simulation import FaultPlan, SimulationReport, simulate
from tasklease.testing.simulation.stores import store_factory
from tasklease.worker.core import steps as rules
from tasklease.worker.core.records import RunRecord
from tasklease.worker.core.steps import StepRecord
from tasklease.worker.stores.memory.store import MemoryStore


def _run(
    tmp_path: Path, kinds: list[str], seed: int, lifecycles: int, faults: FaultPlan | None = None
) -> SimulationReport:
    return simulate(
        store_factory("sqlite", tmp_path),
        seed=seed,
        lifecycles=lifecycles,
        workload=kinds,
        faults=faults,
        store_name="sqlite",
    )


def _invariants(report: SimulationReport) -> set[str]:
    return {violation.invariant for violation in report.found}


def test_the_new_kinds_run_clean_on_sqlite_and_memory(tmp_path: Path) -> None:
    kinds = ["outbox", "steps", "continuation", "fan_out"]
    on_sqlite = _run(tmp_path, kinds, seed=3, lifecycles=150)
    on_memory = simulate(MemoryStore, seed=3, lifecycles=150, workload=kinds)

    assert on_sqlite.violations == (), on_sqlite.violations[:3]
    assert on_memory.violations == (), on_memory.violations[:3]


# A claim that deletes its entries at once, "marking" them done before their tasks exist: a
# relay killed before the create loses them. Kills are made likelier than by default so a
# short run meets one between a claim and its create.
LOST_SEED, LOST_LIFECYCLES = 5, 300
KILLS = dataclasses.replace(FaultPlan.only(["kill"]), kill=0.05)


def test_an_outbox_entry_deleted_before_its_task_is_created_is_a_lost_enqueue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean = _run(tmp_path, ["outbox"], LOST_SEED, LOST_LIFECYCLES, KILLS)
    claim = SQLiteOutbox.claim

    def claim_and_delete(
        self: SQLiteOutbox, limit: int, now: float, lease: float
    ) -> list[Entry | Undecodable]:
        claimed = claim(self, limit, now, lease)
        if claimed:  # Gone from the outbox: marked sent and purged, its task not created yet.
            SQLiteOutbox.mark_sent(self, [item.id for item in claimed], now)
            self.purge_sent(now + 1.0)
        return claimed

    monkeypatch.setattr(SQLiteOutbox, "claim", claim_and_delete)
    planted = _run(tmp_path, ["outbox"], LOST_SEED, LOST_LIFECYCLES, KILLS)

    assert clean.violations == (), clean.violations[:3]
    assert "lost_enqueue" in _invariants(planted), planted.violations[:3]


# The databases of the stores with a service, each run on its real service started for the
# session: their outboxes are tasklease's for Postgres, Firestore and Spanner.
SERVICE_STORES = [
    pytest.param("postgres", marks=pytest.mark.service),
    pytest.param("firestore", marks=pytest.mark.service),
    pytest.param("spanner", marks=pytest.mark.service),
]


@pytest.fixture(params=SERVICE_STORES)
def service_store(request: pytest.FixtureRequest) -> Iterator[str]:
    """A store kind, its service running and the environment pointing at it."""
    name: str = request.param
    with pytest.MonkeyPatch.context() as env:
        if name == "postgres":
            env.setenv("TASKLEASE_STORE", request.getfixturevalue("postgres_cluster").url())
        elif name == "firestore" and request.getfixturevalue("firestore_host") is None:
            pytest.skip("the simulation runs on the Firestore emulator only")
        elif name == "spanner":
            request.getfixturevalue("spanner_emulator")
        yield name


def _on(
    store: str, tmp_path: Path, seed: int, lifecycles: int, faults: FaultPlan | None = None
) -> SimulationReport:
    return simulate(
        store_factory(store, tmp_path),
        seed=seed,
        lifecycles=lifecycles,
        workload=["outbox"],
        faults=faults,
        store_name=store,
        keep_trace=True,
    )


def _outcomes(report: SimulationReport) -> tuple[int, int]:
    """(commits, rollbacks) of the users' outbox transactions, as the trace has them."""
    notes = [line.split()[-2:] for line in report.trace if " outbox o" in line]
    return (
        sum(1 for _, outcome in notes if outcome == "commit"),
        sum(1 for _, outcome in notes if outcome == "rollback"),
    )


OUTBOX_SEED, OUTBOX_LIFECYCLES = 4, 36


def test_the_outbox_workload_runs_clean_and_the_same_twice_on_each_database(
    service_store: str, tmp_path: Path
) -> None:
    report = _on(service_store, tmp_path, OUTBOX_SEED, OUTBOX_LIFECYCLES)
    again = _on(service_store, tmp_path, OUTBOX_SEED, OUTBOX_LIFECYCLES)
    commits, rollbacks = _outcomes(report)

    assert report.violations == (), report.violations[:3]
    assert report.store == service_store
    assert commits > 0
    assert rollbacks > 0
    assert commits + rollbacks == OUTBOX_LIFECYCLES
    assert sum(report.faults.values()) > 0
    assert any("FAULT kill relay" in line for line in report.trace)
    assert again.trace_hash == report.trace_hash


# On Postgres, as on SQLite above: the entries a claim deletes at once are lost when a relay
# is killed before their create.
PG_LOST_SEED, PG_LOST_LIFECYCLES = 5, 60


@pytest.mark.service
def test_an_outbox_entry_deleted_before_its_task_is_created_is_lost_on_postgres(
    postgres_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKLEASE_STORE", postgres_cluster.url())
    clean = _on("postgres", tmp_path, PG_LOST_SEED, PG_LOST_LIFECYCLES, KILLS)
    claim = PostgresOutbox.claim

    def claim_and_delete(
        self: PostgresOutbox, limit: int, now: float, lease: float
    ) -> list[Entry | Undecodable]:
        claimed = claim(self, limit, now, lease)
        if claimed:  # Gone from the outbox: marked sent and purged, its task not created yet.
            PostgresOutbox.mark_sent(self, [item.id for item in claimed], now)
            self.purge_sent(now + 1.0)
        return claimed

    monkeypatch.setattr(PostgresOutbox, "claim", claim_and_delete)
    planted = _on("postgres", tmp_path, PG_LOST_SEED, PG_LOST_LIFECYCLES, KILLS)

    assert clean.violations == (), clean.violations[:3]
    assert "lost_enqueue" in _invariants(planted), planted.violations[:3]


ROLLBACK_SEED, ROLLBACK_LIFECYCLES = 1, 100


def test_a_staged_enqueue_that_escapes_its_rollback_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean = _run(tmp_path, ["outbox"], ROLLBACK_SEED, ROLLBACK_LIFECYCLES)
    stage = adapters.stage

    def stage_on_the_side(tx: Any, entries: Sequence[Entry]) -> list[bool]:
        # The entry goes in through a connection of its own, committed at once.
        path = tx.execute("PRAGMA database_list").fetchone()[2]
        side = sqlite3.connect(path, isolation_level=None)
        try:
            side.execute("BEGIN")
            staged = stage(side, entries)
            side.commit()
        finally:
            side.close()
        return staged

    monkeypatch.setattr(adapters, "stage", stage_on_the_side)
    planted = _run(tmp_path, ["outbox"], ROLLBACK_SEED, ROLLBACK_LIFECYCLES)

    assert clean.violations == (), clean.violations[:3]
    assert _invariants(planted) == {"rolled_back_enqueued"}, planted.violations[:3]


STEPS_SEED, STEPS_LIFECYCLES = 2, 300


def test_a_step_record_never_read_back_is_a_step_repeated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean = _run(tmp_path, ["steps"], STEPS_SEED, STEPS_LIFECYCLES)

    def forgotten(record: RunRecord) -> dict[str, StepRecord]:
        return {}

    monkeypatch.setattr(rules, "steps_of", forgotten)
    planted = _run(tmp_path, ["steps"], STEPS_SEED, STEPS_LIFECYCLES)

    assert clean.violations == (), clean.violations[:3]
    assert "step_repeated" in _invariants(planted), planted.violations[:3]
