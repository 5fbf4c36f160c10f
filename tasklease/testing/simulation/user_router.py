"""The simulation over a user's own router: the ``tasklease_simulation`` fixture's value.

The user's handlers run as the real executor calls them, under the simulation's faults (kills,
stalls, duplicates, lost answers, short deadlines, store faults, clock skew), on virtual time.
Each step of a handler's effect is reported with :meth:`UserSimulation.effect`: a fenced write
to the simulation's downstream, presenting the token and idempotency key a careful third-party
call presents (or those the handler gives instead), so the checker judges the user's effects
as it judges the built-in workload's.

    def test_charges_once(tasklease_simulation):
        router = Router()

        @router.task("charge", lease=timedelta(seconds=30))
        def charge(payload, ctx):
            tasklease_simulation.effect(ctx, "payments", final=True)

        report = tasklease_simulation.run(router, tasks=[("charge", {"cents": 5})], seed=3)
        tasklease_simulation.assert_clean(report)
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tasklease.producer.transport import TaskRequest
from tasklease.testing.simulation.cloud import ScheduledJob
from tasklease.testing.simulation.faults import FaultPlan
from tasklease.testing.simulation.history import Origin
from tasklease.testing.simulation.ledgers import LedgerRow
from tasklease.testing.simulation.run import (
    BuiltScenario,
    LifecycleStarts,
    ScenarioWorld,
    SimulationReport,
    simulate,
)
from tasklease.testing.simulation.stores import STORE_NAMES, store_factory
from tasklease.testing.simulation.workload import Downstream
from tasklease.worker.core.identity import Kind
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.handlers.spec import JobRetry
from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["RouterScenario", "UserSimulation"]

DEFAULT_LIFECYCLES = 300
SHOWN_VIOLATIONS = 5  # How many assert_clean lists before "and N more".
_TWICE = 0.2  # How often a user enqueues the same key again (the second creates nothing).
_MANUAL = 0.2  # How often a job's lifecycle is a manual run rather than a slot.
_MANUAL_LEAD = (1200.0, 3600.0)  # As the built-in workload's: unmistakably manual.
_DEFAULT_ATTEMPT_DEADLINE = 180.0  # Cloud Scheduler's for HTTP targets.


class RouterScenario:
    """A simulation scenario of a user's router: its tasks (enqueued by key, sometimes
    twice) and its scheduled jobs (slots, and now and then a manual run)."""

    arrival_gap = 2.0

    def __init__(
        self,
        simulation: UserSimulation,
        router: Router,
        tasks: Sequence[tuple[str, object]],
        jobs: Sequence[str],
        replay_hint: str,
    ) -> None:
        self.simulation, self.router = simulation, router
        self.tasks, self.job_names = list(tasks), list(jobs)
        self.replay_hint = replay_hint

    def build(self, world: ScenarioWorld) -> BuiltScenario:
        transactional = [
            spec.name for spec in self.router if spec.transactional and self._used(spec.name)
        ]
        if transactional and world.ledger is None:
            raise ValueError(
                f"handler(s) {', '.join(transactional)} are transactional and the "
                f"{world.store_name} store has no transactions: run with store='sqlite'"
            )
        self.simulation.attach(world)
        jobs = []
        for name in self.job_names:
            spec = self.router.handler(Kind.SCHEDULER, name)
            assert spec is not None  # UserSimulation.run checked the names.
            retry = spec.retry or JobRetry()  # As the job declares it: Cloud Scheduler's.
            deadline = spec.attempt_deadline
            jobs.append(
                ScheduledJob(
                    name,
                    retry_count=retry.retry_count,
                    min_backoff=retry.min_backoff_duration.total_seconds(),
                    max_backoff=retry.max_backoff_duration.total_seconds(),
                    max_doublings=retry.max_doublings,
                    attempt_deadline=_DEFAULT_ATTEMPT_DEADLINE
                    if deadline is None
                    else deadline.total_seconds(),
                    resources=(name,) if spec.exclusive else (),
                    transactional=spec.transactional,
                )
            )
        kinds = [f"task:{i}" for i in range(len(self.tasks))]
        kinds += [f"job:{name}" for name in self.job_names]
        return BuiltScenario(self.router, jobs, kinds)

    def _used(self, name: str) -> bool:
        return name in self.job_names or any(task == name for task, _ in self.tasks)

    def classify(self, request: TaskRequest) -> Origin:
        handler = request.url.rsplit("/", 1)[-1]
        spec = self.router.handler(Kind.TASK, handler)
        transactional = spec is not None and spec.transactional
        return Origin(f"task:{request.task_id}", "task", handler, transactional=transactional)

    def starter(
        self, starts: LifecycleStarts, kind: str, number: int, at: float
    ) -> Callable[[], None]:
        rng = starts.arrival_rng
        family, _, which = kind.partition(":")
        if family == "task":
            task, payload = self.tasks[int(which)]
            twice = rng.random() < _TWICE

            def user() -> None:
                starts.producer.enqueue(task, payload, key=f"u{number}")
                if twice:
                    starts.producer.enqueue(task, payload, key=f"u{number}")

            return lambda: starts.start_user(user)
        job = starts.jobs[which]
        if rng.random() < _MANUAL:
            next_slot = starts.unused_slot(job, math.ceil(at + rng.uniform(*_MANUAL_LEAD)))
            return lambda: starts.scheduler.run_now(job, next_slot)
        slot = starts.unused_slot(job, math.ceil(at))
        return lambda: starts.scheduler.fire_slot(job, slot)

    def replay(self, store: str, seed: int, lifecycles: int, plan: FaultPlan) -> str:
        return (
            f"{self.replay_hint}tasklease_simulation.run(..., seed={seed}, "
            f"lifecycles={lifecycles}, store={store!r})"
        )


class UserSimulation:
    """The simulation over a user's router (the ``tasklease_simulation`` fixture): handlers
    report their effects with :meth:`effect`, a test runs them with :meth:`run` and fails
    on what the checker found with :meth:`assert_clean`."""

    def __init__(self, directory: Path | None = None, *, test: str | None = None) -> None:
        """SQLite files go in ``directory`` (default: a temporary one per run); ``test``
        (a pytest node id) is named in the violations' replay hints."""
        self.directory = directory
        self.replay_hint = f"rerun {test} with " if test else ""
        self._downstream: Downstream | None = None
        self._world: ScenarioWorld | None = None
        self._steps: dict[tuple[str, str], int] = {}

    def attach(self, world: ScenarioWorld) -> None:
        """Point :meth:`effect` at the simulation being built (called by the scenario)."""
        self._world = world
        self._downstream = Downstream(world.engine, world.history, world.trace, world.work_rng)
        self._steps = {}

    def effect(
        self,
        ctx: TaskContext,
        name: str,
        *,
        final: bool = False,
        token: int | None = None,
        key: str | None = None,
    ) -> None:
        """One step of the handler's effect on the downstream resource ``name``, fenced as a
        careful handler fences it: under a lock (a concurrency key, an exclusive job) by
        ``ctx.lock_fencing_token`` on the lock's resource, else by ``ctx.fencing_token`` on the
        run's, presenting ``ctx.idempotency_key``. ``token`` and ``key`` are what the
        handler's own call presents, if it presents something else. ``final`` marks the step
        that completes the effect: every acknowledged lifecycle must have made one. In a
        transactional handler, a final step also commits a ledger row in ``ctx.transaction``.
        Raises :class:`~tasklease.errors.LeaseLost` when the lease ran out on the way."""
        downstream, world = self._downstream, self._world
        if downstream is None or world is None:
            raise RuntimeError(
                "tasklease_simulation.effect() is for handlers the simulation runs: "
                "call tasklease_simulation.run(router, ...) and let it call them"
            )
        actor = world.engine.current_actor()
        origin = actor.origin if actor is not None and actor.origin else "?"
        lock, lock_token = ctx.lock, ctx.lock_fencing_token
        base, fence = (
            (lock, lock_token)
            if lock is not None and lock_token is not None
            else (
                origin,
                ctx.fencing_token,
            )
        )
        step = self._steps.get((ctx.attempt_id, name), 0)
        self._steps[ctx.attempt_id, name] = step + 1
        lifecycle = world.history.origins.get(origin)
        if final and world.ledger is not None and lifecycle is not None and lifecycle.transactional:
            world.ledger.write(ctx.transaction, LedgerRow(ctx.run_id, ctx.attempt_id, origin))
        downstream.write(
            ctx,
            resource=f"{base}/{name}",
            token=fence if token is None else token,
            step=step,
            final=final,
            key=key,
        )

    def run(
        self,
        router: Router,
        *,
        tasks: Iterable[tuple[str, object]] = (),
        jobs: Iterable[str] = (),
        seed: int = 1,
        lifecycles: int = DEFAULT_LIFECYCLES,
        store: str | Callable[[], LeaseStore] = "memory",
        faults: Iterable[str] | FaultPlan | None = None,
    ) -> SimulationReport:
        """Run ``lifecycles`` lifecycles of ``router``'s handlers, each a task of ``tasks``
        (``(task_name, payload)``, enqueued by key) or a run of a scheduled job of ``jobs``,
        drawn by the ``seed``, under the ``faults`` it draws (default: every kind), on the
        ``store`` (a name of :data:`STORE_NAMES` or a factory of fresh stores). The report's
        violations each end with the call that replays them: the same seed, and as many
        lifecycles (fewer replay a prefix)."""
        chosen_tasks, chosen_jobs = list(tasks), list(jobs)
        self._check(router, chosen_tasks, chosen_jobs, lifecycles)
        scenario = RouterScenario(self, router, chosen_tasks, chosen_jobs, self.replay_hint)
        try:
            with self._stores(store) as (factory, name):
                return simulate(
                    factory,
                    seed=seed,
                    lifecycles=lifecycles,
                    faults=faults,
                    store_name=name,
                    scenario=scenario,
                )
        finally:
            self._downstream, self._world = None, None

    @staticmethod
    def assert_clean(report: SimulationReport) -> None:
        """Fail (AssertionError) listing the report's first violations, if it has any."""
        if not report.violations:
            return
        shown = "\n".join(f"- {v}" for v in report.violations[:SHOWN_VIOLATIONS])
        more = len(report.violations) - SHOWN_VIOLATIONS
        rest = f"\n... and {more} more" if more > 0 else ""
        raise AssertionError(
            f"the simulation found {len(report.violations)} violation(s) in "
            f"{report.lifecycles} lifecycles (seed {report.seed}, {report.store} store):\n"
            f"{shown}{rest}"
        )

    @staticmethod
    def _check(
        router: Router, tasks: list[tuple[str, object]], jobs: list[str], lifecycles: int
    ) -> None:
        if lifecycles < 1:
            raise ValueError(f"lifecycles must be at least 1, not {lifecycles}: pass lifecycles=N")
        if not tasks and not jobs:
            raise ValueError(
                "nothing to simulate: pass tasks=[(task_name, payload), ...] and/or "
                "jobs=[job_name, ...] naming the router's handlers"
            )
        task_names = sorted(s.name for s in router if s.kind == Kind.TASK)
        job_names = sorted(s.name for s in router if s.kind == Kind.SCHEDULER)
        for entry in tasks:
            if not (isinstance(entry, tuple) and len(entry) == 2):
                raise ValueError(f"tasks entry {entry!r}: write (task_name, payload)")
            if not router.has_task(entry[0]):
                raise ValueError(
                    f"task {entry[0]!r} is not a task handler of the router: register it "
                    f"with @router.task({entry[0]!r}) or choose from {_listed(task_names)}"
                )
        for job in jobs:
            if router.handler(Kind.SCHEDULER, job) is None:
                raise ValueError(
                    f"job {job!r} is not a scheduled handler of the router: declare it with "
                    f"@router.scheduled({job!r}) or choose from {_listed(job_names)}"
                )

    @contextmanager
    def _stores(
        self, store: str | Callable[[], LeaseStore]
    ) -> Iterator[tuple[Callable[[], LeaseStore], str | None]]:
        if callable(store):
            yield store, None
            return
        if store not in STORE_NAMES:
            raise ValueError(
                f"unknown store {store!r}: pass store= one of {', '.join(STORE_NAMES)}, "
                "or a factory of fresh stores"
            )
        if self.directory is not None:
            yield store_factory(store, self.directory), store
            return
        with tempfile.TemporaryDirectory(prefix="tasklease-sim-") as directory:
            yield store_factory(store, Path(directory)), store


def _listed(names: list[str]) -> str:
    return ", ".join(names) if names else "(none registered)"
