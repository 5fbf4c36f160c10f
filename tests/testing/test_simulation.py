"""The simulation: seeded, deterministic across processes and stores, faults as asked, bad
arguments refused by name, and the real protocol's history passing the checker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from tasklease.testing.simulation import FAULT_KINDS, WORKLOAD_KINDS, FaultPlan, simulate
from tasklease.testing.simulation.engine import Engine, Instance
from tasklease.testing.simulation.workload import NEEDS_TRANSACTIONS
from tasklease.worker.stores import MemoryStore, SqliteStore

# The kinds of lifecycle every store runs (the rest need a store with transactions).
# What both stores run alike (fan_in's then handler writes a ledger row where there is one).
PORTABLE = sorted(set(WORKLOAD_KINDS) - NEEDS_TRANSACTIONS - {"fan_in"})


def test_a_seed_gives_one_trace_and_no_violations() -> None:
    first = simulate(MemoryStore, seed=11, lifecycles=300)
    again = simulate(MemoryStore, seed=11, lifecycles=300)

    assert first.violations == ()
    assert first.lifecycles == 300
    assert first.deliveries >= first.lifecycles
    assert first.trace_hash == again.trace_hash
    assert first.faults == again.faults
    assert simulate(MemoryStore, seed=12, lifecycles=300).trace_hash != first.trace_hash


def test_every_fault_kind_fires_by_default() -> None:
    report = simulate(MemoryStore, seed=3, lifecycles=1500)

    assert report.violations == ()
    assert set(report.faults) == set(FAULT_KINDS)
    assert all(count > 0 for count in report.faults.values())


def test_faults_narrow_to_the_kinds_asked_for() -> None:
    calm = simulate(MemoryStore, seed=5, lifecycles=200, faults=[])
    kills = simulate(MemoryStore, seed=5, lifecycles=200, faults=["kill"])

    assert calm.faults == {}
    assert set(kills.faults) == {"kill"}  # A deadline a kill runs into is no fault of its own.
    assert calm.violations == kills.violations == ()


def test_a_held_up_request_is_drawn_apart_so_a_run_where_none_fires_is_unchanged() -> None:
    others = [kind for kind in FAULT_KINDS if kind != "slow_request"]
    without = simulate(MemoryStore, seed=4, lifecycles=120, faults=others)
    never = simulate(MemoryStore, seed=4, lifecycles=120, faults=FaultPlan(slow_request=0.0))
    held_up = simulate(MemoryStore, seed=4, lifecycles=120, faults=FaultPlan(slow_request=0.05))

    assert never.trace_hash == without.trace_hash
    assert held_up.faults["slow_request"] > 0 and held_up.trace_hash != without.trace_hash
    assert held_up.violations == ()


def test_the_same_seed_gives_the_same_trace_on_memory_and_sqlite(tmp_path: Path) -> None:
    memory = simulate(MemoryStore, seed=7, lifecycles=300, workload=PORTABLE)
    sqlite = simulate(
        lambda: SqliteStore(tmp_path / "sim.db"), seed=7, lifecycles=300, workload=PORTABLE
    )

    assert sqlite.violations == ()
    assert sqlite.trace_hash == memory.trace_hash


def test_another_process_replays_the_same_trace(tmp_path: Path) -> None:
    script = (
        "from tasklease.testing.simulation import simulate\n"
        "from tasklease.worker.stores import MemoryStore\n"
        "print(simulate(MemoryStore, seed=9, lifecycles=200).trace_hash)\n"
    )
    hashes = {
        subprocess.run(
            [sys.executable, "-c", script],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
        ).stdout.strip()
        for hash_seed in (1, 2)
    }

    assert hashes == {simulate(MemoryStore, seed=9, lifecycles=200).trace_hash}


def test_the_report_ends_with_one_line_of_counts() -> None:
    report = simulate(MemoryStore, seed=2, lifecycles=50)
    faults = sum(report.faults.values())

    assert report.line() == (
        f"50 lifecycles, {report.deliveries} deliveries, {faults} faults, 0 violations, "
        f"trace hash {report.trace_hash}"
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"lifecycles": 0}, "lifecycles must be at least 1"),
        ({"lifecycles": 5, "faults": ["kill", "meteor"]}, "unknown fault kind(s) meteor: choose"),
        ({"lifecycles": 5, "workload": ["cron"]}, "unknown workload kind(s) cron: choose from"),
        ({"lifecycles": 5, "workload": ["transactional"]}, "runs none of the workload kinds"),
    ],
)
def test_bad_arguments_are_refused_by_name(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        simulate(MemoryStore, seed=1, **arguments)  # type: ignore[arg-type]


def test_the_engine_runs_one_actor_at_a_time_in_virtual_time_order() -> None:
    engine = Engine()
    seen: list[tuple[float, str]] = []
    running: list[str] = []

    def actor(name: str, pauses: list[float]) -> None:
        for pause in pauses:
            running.append(name)
            assert running == [name], "two actors ran at once"
            seen.append((engine.now, name))
            running.pop()
            engine.pause(pause)

    engine.spawn("a", None, lambda: actor("a", [2.0, 2.0]))
    engine.spawn("b", None, lambda: actor("b", [1.0, 3.0]), delay=0.5)
    engine.run(until=100.0)

    assert seen == [(0.0, "a"), (0.5, "b"), (1.5, "b"), (2.0, "a")]
    assert engine.now == 4.5  # b's last pause ends last.


@pytest.mark.parametrize("pauses_first", [0, 1, 3])
def test_an_exception_escaping_an_actor_is_recorded_after_any_number_of_pauses(
    pauses_first: int,
) -> None:
    engine = Engine()

    def work() -> None:
        for _ in range(pauses_first):
            engine.pause(1.0)
        raise RuntimeError("escaped real code")

    actor = engine.spawn("w", None, work)
    engine.run(until=100.0)

    assert actor.done
    assert engine.crashed == [actor]
    assert isinstance(actor.crash, RuntimeError)


def test_a_killed_instance_stops_its_actors_at_their_next_pause() -> None:
    engine = Engine()
    instance = Instance("i1", skew=timedelta(0))
    steps: list[int] = []

    def work() -> None:
        for step in range(5):
            steps.append(step)
            if step == 1:
                instance.killed = True
            engine.pause(1.0)

    actor = engine.spawn("w", instance, work)
    engine.run(until=100.0)

    assert steps == [0, 1]
    assert actor.done
    assert actor.crash is None
