"""The simulation over a user's router (UserSimulation, the tasklease_simulation fixture's
value): what it refuses, and a planted fencing bug and a transactional handler run on it."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease.testing.simulation.user_router import UserSimulation
from tasklease.worker import Router, TaskContext

LEASE = timedelta(seconds=30)


@pytest.fixture
def sim(tmp_path: Path) -> UserSimulation:
    return UserSimulation(tmp_path, test="test_user_router")


def router_of(sim: UserSimulation, *, fence_by_run: bool = False) -> Router:
    router = Router()

    @router.task("deposit", lease=LEASE, concurrency_key=lambda payload: payload["account"])
    def deposit(payload: dict[str, Any], ctx: TaskContext) -> None:
        # The planted bug: fencing a keyed effect by the run's token, not the lock's.
        token = ctx.fencing_token if fence_by_run else None
        sim.effect(ctx, "balance", token=token)
        sim.effect(ctx, "balance", token=token, final=True)

    @router.scheduled("nightly", lease=LEASE)
    def nightly(ctx: TaskContext) -> None:
        sim.effect(ctx, "report", final=True)

    return router


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"tasks": [("refund", {})]}, "task 'refund' is not a task handler of the router: "),
        ({"jobs": ["weekly"]}, r"job 'weekly' is not a scheduled handler .* nightly$"),
        ({"jobs": ["nightly"], "lifecycles": 0}, "lifecycles must be at least 1, not 0"),
        ({"jobs": ["nightly"], "store": "redis"}, "unknown store 'redis': pass store= one of"),
        ({}, r"nothing to simulate: pass tasks=\[\(task_name, payload\), \.\.\.\]"),
        ({"tasks": ["deposit"]}, r"tasks entry 'deposit': write \(task_name, payload\)"),
    ],
)
def test_bad_input_is_refused_naming_the_fix(
    sim: UserSimulation, call: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        sim.run(router_of(sim), **call)


def test_a_transactional_handler_on_a_store_without_transactions_is_refused(
    sim: UserSimulation,
) -> None:
    router = Router()
    router.task("book", transactional=True)(lambda payload, ctx: None)
    with pytest.raises(ValueError, match=r"handler\(s\) book are transactional .* store='sqlite'"):
        sim.run(router, tasks=[("book", {})])


def test_an_effect_outside_a_simulation_says_how_to_run_one(sim: UserSimulation) -> None:
    with pytest.raises(RuntimeError, match=r"call tasklease_simulation.run\(router, ...\)"):
        sim.effect(None, "x")  # type: ignore[arg-type]


def test_a_keyed_effect_fenced_by_the_runs_token_is_caught(sim: UserSimulation) -> None:
    tasks: list[tuple[str, object]] = [("deposit", {"account": "a"}), ("deposit", {"account": "b"})]
    careful = sim.run(router_of(sim), tasks=tasks, jobs=["nightly"], seed=2, lifecycles=200)
    sim.assert_clean(careful)
    buggy = sim.run(
        router_of(sim, fence_by_run=True), tasks=tasks, jobs=["nightly"], seed=2, lifecycles=200
    )
    invariants = {v.invariant for v in buggy.found}
    assert invariants & {"token_reused", "fenced_while_holding"}, buggy.violations
    with pytest.raises(AssertionError, match="rerun test_user_router with") as failed:
        sim.assert_clean(buggy)
    listed = str(failed.value).splitlines()
    assert listed[0].startswith(f"the simulation found {len(buggy.violations)} violation(s)")
    assert listed[1:6] == [f"- {v}" for v in buggy.violations[:5]]


def test_a_transactional_handler_commits_its_effect_once_on_sqlite(sim: UserSimulation) -> None:
    router = Router()

    @router.task("book", lease=LEASE, transactional=True)
    def book(payload: dict[str, Any], ctx: TaskContext) -> None:
        sim.effect(ctx, "booking", final=True)

    report = sim.run(router, tasks=[("book", {})], seed=4, lifecycles=100, store="sqlite")
    sim.assert_clean(report)
    assert report.store == "sqlite" and report.lifecycles == 100
