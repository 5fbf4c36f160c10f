"""Replay and shrinking: a failing seed replays exactly in another process, a run's own faults
as its script replay it unchanged, fewer lifecycles cut the same run short, and a planted bug
(claims granted while held) shrinks to a smaller run that fails the same invariant and replays
from its command line."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from unittest import mock

import pytest

from tasklease.testing.simulation import simulate
from tasklease.testing.simulation.faults import FaultPlan
from tasklease.testing.simulation.replay import (
    parse_rates,
    parse_script,
    rates_text,
    replay_command,
    script_text,
)
from tasklease.testing.simulation.shrink import Configuration, Shrunk, ddmin, shrink
from tasklease.testing.simulation.workload import WORKLOAD_KINDS
from tasklease.worker.core import decisions
from tasklease.worker.stores import MemoryStore

# Found within 300 lifecycles on memory, seed 1: the checker sees two holders of one lease.
PLANTED = Configuration("memory", seed=1, lifecycles=300)
# The tasklease command with the same bug planted, for a process of its own.
PLANTED_CLI = """\
import sys
from unittest import mock
from tasklease import cli
from tasklease.worker.core import decisions
with mock.patch.object(decisions, "lease_held", lambda record, now: False):
    sys.exit(cli.main(sys.argv[1:]))
"""


def claims_granted_while_held() -> mock._patch[object]:
    return mock.patch.object(decisions, "lease_held", lambda record, now: False)


@pytest.fixture(scope="module")
def shrunk() -> Shrunk:
    with claims_granted_while_held():  # Only while it shrinks: other tests run unbroken.
        return shrink(MemoryStore, PLANTED)


def replayed(command: str, hash_seed: int) -> tuple[int, list[str]]:
    """``command`` (a replay line) run with the bug planted in a process of its own."""
    words = shlex.split(command)
    assert words[0] == "tasklease"
    done = subprocess.run(
        [sys.executable, "-c", PLANTED_CLI, *words[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
    )
    return done.returncode, done.stdout.splitlines()


def test_a_planted_bug_shrinks_to_fewer_lifecycles_and_faults_failing_the_same_invariant(
    shrunk: Shrunk,
) -> None:
    before, after = shrunk.original_report, shrunk.report

    assert shrunk.complete
    assert any(v.invariant == shrunk.invariant for v in before.found)
    assert any(v.invariant == shrunk.invariant for v in after.found)
    assert after.lifecycles < before.lifecycles
    assert 0 < sum(after.faults.values()) < sum(before.faults.values())
    assert shrunk.configuration.script == frozenset(after.fired)  # Each kept fault fired.
    assert shrunk.replay in after.violations[0]  # Its violations name the shrunk command.
    assert shrunk.replay in shrunk.summary()


def test_the_shrunk_run_replays_exactly_here_and_in_another_process(shrunk: Shrunk) -> None:
    with claims_granted_while_held():
        again = shrunk.configuration.run(MemoryStore)
    assert again.trace_hash == shrunk.report.trace_hash
    assert again.violations == shrunk.report.violations

    code, lines = replayed(shrunk.replay, hash_seed=3)

    assert code == 1
    assert lines == [*shrunk.report.violations, shrunk.report.line()]


def test_a_failing_seed_replays_exactly_in_another_process(shrunk: Shrunk) -> None:
    original = shrunk.original_report
    assert original.violations

    code, lines = replayed(PLANTED.replay, hash_seed=2)

    assert code == 1
    assert lines == [*original.violations, original.line()]


def test_a_run_replayed_with_its_own_faults_as_its_script_is_the_same_run() -> None:
    free = simulate(MemoryStore, seed=4, lifecycles=120)
    scripted = simulate(
        MemoryStore, seed=4, lifecycles=120, faults=FaultPlan(script=frozenset(free.fired))
    )
    none = simulate(MemoryStore, seed=4, lifecycles=120, faults=FaultPlan(script=frozenset()))

    assert free.fired
    assert (scripted.trace_hash, scripted.faults) == (free.trace_hash, free.faults)
    assert scripted.fired == free.fired
    assert none.fired == ()
    assert set(none.faults) <= {"dispatch_deadline"}  # No draw: what a slow attempt meets.


def test_fewer_lifecycles_are_the_same_run_up_to_the_first_one_left_out() -> None:
    shorter = simulate(MemoryStore, seed=6, lifecycles=40, keep_trace=True)
    longer = simulate(MemoryStore, seed=6, lifecycles=80, keep_trace=True)
    # Lifecycles start at whole seconds, one at least a second after another: up to the
    # last start of the shorter run and its first half second, nothing differs.
    # Only the users' creates start lifecycles (their keys: a letter and the lifecycle's
    # number); fan-out children and continuations are created by handlers.
    starts = [
        line
        for line in shorter.trace
        if re.search(r" create \S*-[a-z]\d+$", line) or " fire " in line
    ]
    until = float(starts[-1].split()[0])

    def up_to(trace: Sequence[str]) -> list[str]:
        return [line for line in trace if float(line.split()[0]) <= until]

    assert len(up_to(shorter.trace)) > 100
    assert up_to(shorter.trace) == up_to(longer.trace)


def test_shrinking_stops_at_its_run_budget_with_a_run_that_still_fails(shrunk: Shrunk) -> None:
    with claims_granted_while_held():
        stopped = shrink(MemoryStore, PLANTED, report=shrunk.original_report, max_runs=3)

    assert not stopped.complete
    assert stopped.runs == 3
    assert any(v.invariant == stopped.invariant for v in stopped.report.found)
    assert stopped.report.lifecycles <= PLANTED.lifecycles


def test_a_run_that_breaks_nothing_has_nothing_to_shrink() -> None:
    calm = Configuration("memory", seed=1, lifecycles=20)

    with pytest.raises(ValueError, match="finds no violation: nothing to shrink"):
        shrink(MemoryStore, calm)


def test_ddmin_keeps_just_the_items_a_failure_needs() -> None:
    runs: list[int] = []

    def needs_3_and_11(subset: Sequence[int]) -> bool:
        runs.append(len(subset))
        return {3, 11} <= set(subset)

    assert ddmin(range(20), needs_3_and_11) == [3, 11]
    assert len(runs) < 40
    assert ddmin(range(5), lambda subset: True) == []
    assert ddmin([7], bool) == [7]


def test_rates_read_back_as_they_were_written() -> None:
    rates = {"stall": 0.05, "duplicate": 0.2}

    assert rates_text(rates) == "duplicate=0.2,stall=0.05"
    assert parse_rates(rates_text(rates)) == rates
    assert parse_rates("none") == {}
    plan = FaultPlan().with_rates(rates)
    assert plan.rates == rates and FaultPlan().rates == {}
    assert replay_command("memory", 3, 10, plan, WORKLOAD_KINDS) == (
        "tasklease simulate --store memory --seed 3 --lifecycles 10 "
        "--rates duplicate=0.2,stall=0.05"
    )
    configuration = Configuration("memory", 3, 10, rates=tuple(sorted(rates.items())))
    assert configuration.plan.rates == rates and configuration.replay == replay_command(
        "memory", 3, 10, plan, WORKLOAD_KINDS
    )


def test_a_script_reads_back_as_it_was_written() -> None:
    script = frozenset({("kill", 0), ("stall", 3), ("kill", 12)})

    assert script_text(script) == "kill:0,kill:12,stall:3"
    assert parse_script(script_text(script)) == script
    assert parse_script("none") == frozenset() and script_text(()) == "none"
    with pytest.raises(ValueError, match=r"bad fault occurrence 'melt:1': write KIND:N"):
        parse_script("kill:1,melt:1")
    with pytest.raises(ValueError, match="bad fault occurrence 'kill'"):
        parse_script("kill")
    plan = FaultPlan(kinds=frozenset({"kill"}), script=script)
    assert replay_command("sqlite", 5, 10, plan, {"keyed_task"}) == (
        "tasklease simulate --store sqlite --seed 5 --lifecycles 10 --faults kill "
        "--workload keyed_task --keep-faults kill:0,kill:12,stall:3"
    )
