"""``simulate()``: one seeded run of Cloud Tasks, Cloud Scheduler, worker instances and a
store on virtual time, its history checked by
:func:`~tasklease.testing.simulation.checker.check`."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from tasklease.emulator.policy import RetrySettings
from tasklease.producer import Producer
from tasklease.producer.transport import TaskRequest
from tasklease.testing.simulation.cancelling import SimulatedCancels
from tasklease.testing.simulation.checker import HistoryViolation, check
from tasklease.testing.simulation.cloud import (
    DeliverySender,
    Fleet,
    ScheduledJob,
    SimulatedQueue,
    SimulatedScheduler,
)
from tasklease.testing.simulation.engine import EPOCH, Actor, Engine, Instance, Killed
from tasklease.testing.simulation.faults import (
    FAULT_KINDS,
    FaultPlan,
    Occurrence,
    StoreFaults,
    Trace,
)
from tasklease.testing.simulation.history import Enqueued, History, Origin, Refusal
from tasklease.testing.simulation.ledgers import EffectLedger, ledger_for
from tasklease.testing.simulation.outbox import SimulatedOutbox
from tasklease.testing.simulation.outbox_worlds import outbox_kind, outbox_world
from tasklease.testing.simulation.replay import replay_command
from tasklease.testing.simulation.signalling import SimulatedSignals
from tasklease.testing.simulation.workload import (
    FAN_IN_THEN,
    LEASE,
    LIFECYCLE_KINDS,
    MANUAL_LEAD,
    NEEDS_FAN_INS,
    NEEDS_TRANSACTIONS,
    WAIT_NAME,
    Downstream,
    Workload,
    build_router,
    classify,
    lifecycle,
    producer_for,
)
from tasklease.worker.auth.authenticators import NoAuth
from tasklease.worker.core.outcome import Outcome
from tasklease.worker.delivery.executor import Delivery, Executor
from tasklease.worker.delivery.lease import first_renewal_due, renew_once
from tasklease.worker.delivery.reply import Reply
from tasklease.worker.handlers.attempt import Attempt
from tasklease.worker.handlers.router import Router
from tasklease.worker.runtime.clock import Timing
from tasklease.worker.stores.base.fan_ins import FanInStore
from tasklease.worker.stores.base.store import LeaseStore
from tasklease.worker.stores.base.transactional import TransactionalStore

__all__ = [
    "BuiltScenario",
    "LifecycleStarts",
    "Scenario",
    "ScenarioWorld",
    "SimulationReport",
    "WorkloadScenario",
    "simulate",
]

FLEET_SIZE = 3
# The queue's retries: Cloud Tasks' formulas, with a short backoff so lifecycles settle.
QUEUE_RETRY = RetrySettings(max_attempts=-1, min_backoff=1.0, max_backoff=120.0, max_doublings=5)
# Virtual time past the last lifecycle's start by which every lifecycle must have settled.
SETTLE_WITHIN = 6 * 3600.0


@dataclass(frozen=True)
class SimulationReport:
    """What one simulation did and found."""

    seed: int
    store: str
    lifecycles: int
    deliveries: int
    faults: Mapping[str, int]
    violations: tuple[str, ...]  # Each names its invariant, step and a replay command.
    trace_hash: str
    events: int
    virtual_seconds: float
    found: tuple[HistoryViolation, ...] = ()  # The violations as the checker found them.
    fired: tuple[Occurrence, ...] = ()  # The faults that fired: a script replays them.
    trace: tuple[str, ...] = ()  # The full event trace, when simulate() kept it.

    def line(self) -> str:
        """The one-line summary ``tasklease simulate`` ends with."""
        return (
            f"{self.lifecycles} lifecycles, {self.deliveries} deliveries, "
            f"{sum(self.faults.values())} faults, {len(self.violations)} violations, "
            f"trace hash {self.trace_hash}"
        )


@dataclass(frozen=True)
class ScenarioWorld:
    """What a scenario builds its router on: the simulation's engine, the history its
    checker reads, the trace, the rng of the handlers' own work, and the store's effect
    ledger (None on a store without transactions)."""

    engine: Engine
    history: History
    trace: Trace
    work_rng: random.Random
    ledger: EffectLedger | None
    store_name: str
    store: LeaseStore


@dataclass(frozen=True)
class BuiltScenario:
    """A scenario's router, the scheduler jobs it serves, and the kinds of lifecycle the
    arrivals choose from (in this order: the seed picks by index)."""

    router: Router
    jobs: Sequence[ScheduledJob]
    kinds: Sequence[str]


class LifecycleStarts(Protocol):
    """What a scenario starts its lifecycles with: the running simulation's parts."""

    @property
    def arrival_rng(self) -> random.Random: ...
    @property
    def producer(self) -> Producer: ...
    @property
    def scheduler(self) -> SimulatedScheduler: ...
    @property
    def jobs(self) -> Mapping[str, ScheduledJob]: ...
    @property
    def engine(self) -> Engine: ...
    @property
    def history(self) -> History: ...
    @property
    def outbox(self) -> SimulatedOutbox | None: ...
    def start_user(self, call: Callable[[], None]) -> None: ...
    def unused_slot(self, job: ScheduledJob, second: int) -> float: ...


class Scenario(Protocol):
    """What a simulation runs: the router it builds, what each kind of lifecycle starts,
    and the hint that replays a run. The built-in workload is one (:class:`WorkloadScenario`);
    a user's router is another (:mod:`tasklease.testing.simulation.user_router`)."""

    arrival_gap: float  # Mean virtual seconds between two new lifecycles.

    def build(self, world: ScenarioWorld) -> BuiltScenario:
        """The router, its jobs, and the lifecycle kinds (ValueError if none can run)."""
        ...

    def classify(self, request: TaskRequest) -> Origin:
        """The lifecycle a task the queue just accepted starts."""
        ...

    def starter(
        self, starts: LifecycleStarts, kind: str, number: int, at: float
    ) -> Callable[[], None]:
        """What starts lifecycle ``number`` of ``kind`` at virtual time ``at`` (its shape is
        drawn here, from ``starts.arrival_rng``, so fewer lifecycles is a prefix)."""
        ...

    def replay(self, store: str, seed: int, lifecycles: int, plan: FaultPlan) -> str:
        """How to run this simulation again, exactly."""
        ...


class WorkloadScenario:
    """The simulation's own router (:func:`build_router`) and the lifecycles of a
    :class:`Workload`'s kinds."""

    def __init__(self, workload: Workload) -> None:
        self.asked = workload
        self.workload = workload
        self.arrival_gap = workload.arrival_gap
        self.transactional = frozenset({"ledger"})  # The handlers whose effect is a row.
        self.world: ScenarioWorld | None = None
        self.signals: SimulatedSignals | None = None
        self.cancels: SimulatedCancels | None = None

    def build(self, world: ScenarioWorld) -> BuiltScenario:
        self.world = world
        asked = self.asked
        kinds = asked.kinds if world.ledger is not None else asked.kinds - NEEDS_TRANSACTIONS
        if outbox_kind(world.store) is None:
            kinds -= {"outbox"}
        if not isinstance(world.store, FanInStore):
            kinds -= NEEDS_FAN_INS
        if not kinds:
            raise ValueError(
                f"the {world.store_name} store runs none of the workload kinds asked for: "
                f"{', '.join(sorted(NEEDS_TRANSACTIONS))} needs a store with transactions, "
                f"{', '.join(sorted(NEEDS_FAN_INS))} one that keeps joins; "
                "ask for another kind too"
            )
        self.workload = Workload(kinds, asked.arrival_gap, asked.max_steps)
        if world.ledger is not None:
            self.transactional = frozenset({"ledger", FAN_IN_THEN})
        downstream = Downstream(world.engine, world.history, world.trace, world.work_rng)
        router, jobs = build_router(
            self.workload, downstream, world.ledger, world.engine, world.work_rng
        )
        return BuiltScenario(router, jobs, sorted(self.workload.kinds))

    def classify(self, request: TaskRequest) -> Origin:
        return classify(request, self.transactional)

    def replay(self, store: str, seed: int, lifecycles: int, plan: FaultPlan) -> str:
        return replay_command(store, seed, lifecycles, plan, self.asked.kinds)

    def _signals(self, starts: LifecycleStarts) -> SimulatedSignals:
        """The users who signal waiting runs, over the store and the users' producer."""
        if self.signals is None:
            world = self.world
            assert world is not None, "build() comes first"
            self.signals = SimulatedSignals(
                starts.engine,
                starts.history,
                world.trace,
                world.store,
                starts.producer,
                wait_name=WAIT_NAME,
            )
        return self.signals

    def _cancels(self, starts: LifecycleStarts) -> SimulatedCancels:
        """The users who cancel runs, over the store."""
        if self.cancels is None:
            world = self.world
            assert world is not None, "build() comes first"
            self.cancels = SimulatedCancels(starts.engine, starts.history, world.trace, world.store)
        return self.cancels

    def starter(
        self, starts: LifecycleStarts, kind: str, number: int, at: float
    ) -> Callable[[], None]:
        rng = starts.arrival_rng
        steps = rng.randint(1, self.workload.max_steps)
        twice = rng.random() < 0.2

        def enqueue(task: str, payload: object, key: str) -> Callable[[], None]:
            def user() -> None:
                result = starts.producer.enqueue(task, payload, key=key)
                starts.history.enqueued.append(Enqueued(starts.engine.now, result.task_id, "user"))
                if twice:  # The same key again: Cloud Tasks refuses the name, nothing new.
                    starts.producer.enqueue(task, payload, key=key)

            return lambda: starts.start_user(user)

        if kind in LIFECYCLE_KINDS:
            return lifecycle(
                kind,
                number,
                rng,
                steps=steps,
                enqueue=enqueue,
                outbox=starts.outbox,
                user=starts.start_user,
                signaller=self._signals(starts).user,
                canceller=self._cancels(starts).user,
            )

        if kind == "keyed_task":
            return enqueue("effect", {"steps": steps}, f"e{number}")
        if kind == "concurrency_key":
            key = f"k{rng.randrange(3)}"
            return enqueue("keyed", {"key": key, "steps": steps}, f"c{number}")
        if kind == "transactional":
            return enqueue("ledger", {}, f"l{number}")
        if kind in ("scheduled_job", "exclusive_job"):
            job = starts.jobs["job" if kind == "scheduled_job" else "exclusive"]
            slot = starts.unused_slot(job, math.ceil(at))
            return lambda: starts.scheduler.fire_slot(job, slot)
        assert kind == "manual_run", kind
        job = starts.jobs["job"]
        next_slot = starts.unused_slot(job, math.ceil(at + rng.uniform(*MANUAL_LEAD)))
        return lambda: starts.scheduler.run_now(job, next_slot)


def simulate(
    store_factory: Callable[[], LeaseStore],
    *,
    seed: int,
    lifecycles: int,
    faults: Iterable[str] | FaultPlan | None = None,
    workload: Iterable[str] | Workload | None = None,
    store_name: str | None = None,
    keep_trace: bool = False,
    scenario: Scenario | None = None,
) -> SimulationReport:
    """Run ``lifecycles`` lifecycles of the real executor and ``store_factory()``'s store under
    the faults the ``seed`` draws (default: every kind of :data:`FAULT_KINDS`), and check
    the history. The same seed gives the same trace, in any process. The lifecycles are the
    ``workload``'s of the simulation's own router, or the ``scenario``'s (not both)."""
    if scenario is not None and workload is not None:
        raise ValueError("give simulate() a workload or a scenario, not both")
    if lifecycles < 1:
        raise ValueError(f"lifecycles must be at least 1, not {lifecycles}")
    plan = (
        faults
        if isinstance(faults, FaultPlan)
        else FaultPlan.only(FAULT_KINDS if faults is None else faults)
    )
    if scenario is None:
        chosen = (
            workload
            if isinstance(workload, Workload)
            else (Workload.only(workload) if workload is not None else Workload())
        )
        scenario = WorkloadScenario(chosen)
    name = store_name or _name_of(store_factory)
    with _quiet():
        run = _Simulation(
            store_factory(), name, seed, plan=plan, scenario=scenario, keep_trace=keep_trace
        )
        try:
            return run.run(lifecycles)
        finally:
            run.close()


class _SimulatedLeaseKeeper:
    """Renews leases as the threaded keeper does (:func:`renew_once`), on virtual timers:
    each kept execution gets a renewal actor on its own instance."""

    def __init__(
        self,
        engine: Engine,
        store: LeaseStore,
        clock: Callable[[], datetime],
        instance: Instance,
        attempts: dict[Actor, Attempt],
    ) -> None:
        self.engine, self.store, self.clock, self.instance = engine, store, clock, instance
        self.attempts = attempts  # The attempt each delivery's actor keeps the lease of.

    @contextmanager
    def kept(
        self, live: Attempt, lease: timedelta, *, keep_for: timedelta | None = None
    ) -> Iterator[None]:
        engine = self.engine
        kept = [True]
        origin = engine.current_actor()
        if origin is not None:
            self.attempts[origin] = live

        def renewals() -> None:
            delay = first_renewal_due(live, lease, engine.now) - engine.now
            while True:
                engine.sleep(max(delay, 0.0))
                if not kept[0]:
                    return
                next_in = renew_once(
                    self.store,
                    self.clock,
                    live,
                    lease,
                    keep_for=keep_for,
                    still_kept=lambda: kept[0],
                )
                if next_in is None:
                    return
                delay = next_in

        engine.spawn(
            f"{self.instance.name}:renew-{live.run_id[:8]}",
            self.instance,
            renewals,
            origin=origin.origin if origin is not None else None,
        )
        try:
            yield
        finally:
            kept[0] = False


class _ObservedExecutor(Executor):
    """The real executor; each ``lost_claim`` answer it gives goes into the history, with
    whether the attempt's lease still held by its own clock (the checker's evidence)."""

    def __init__(
        self,
        *args: Any,
        engine: Engine,
        history: History,
        attempts: dict[Actor, Attempt],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.engine, self.history, self.attempts = engine, history, attempts

    def execute(self, delivery: Delivery) -> Reply:
        actor = self.engine.current_actor()
        try:
            reply = super().execute(delivery)
        finally:  # A killed delivery unwinds through here too: forget its attempt.
            live = self.attempts.pop(actor, None) if actor is not None else None
        if reply.outcome is Outcome.LOST_CLAIM and live is not None and actor is not None:
            self.history.refusals.append(
                Refusal(self.engine.now, actor.origin or "?", live.attempt_id, not live.lease_lost)
            )
        return reply


class _Simulation:
    def __init__(
        self,
        store: LeaseStore,
        store_name: str,
        seed: int,
        *,
        plan: FaultPlan,
        scenario: Scenario,
        keep_trace: bool,
    ) -> None:
        self.seed, self.plan = seed, plan
        self.store = store
        self.engine = engine = Engine()
        self.trace = Trace(engine, keep=keep_trace, script=plan.script)
        self.schedule_rng = random.Random(f"{seed}/schedule")
        self.fault_rng = random.Random(f"{seed}/faults")
        self.work_rng = random.Random(f"{seed}/work")
        self.id_rng = random.Random(f"{seed}/ids")
        # The lifecycles' arrivals and shapes, drawn apart from what runs: a run of fewer
        # lifecycles is the same run up to the first lifecycle it leaves out.
        self.arrival_rng = random.Random(f"{seed}/arrivals")
        self.ledger = ledger_for(store) if isinstance(store, TransactionalStore) else None
        if self.ledger is not None:
            self.ledger.prepare()
        self.scenario = scenario
        self.history = History(seed, store_name)
        if plan.on("clock_skew"):
            self.history.max_clock_skew = plan.max_clock_skew.total_seconds()
        self.store_faults = StoreFaults(
            engine,
            store,
            plan,
            self.fault_rng,
            self.trace,
            slow_rng=random.Random(f"{seed}/slow_request"),
            slow_for=(0.5 * LEASE.total_seconds(), 2.5 * LEASE.total_seconds()),
        )
        world = ScenarioWorld(
            engine, self.history, self.trace, self.work_rng, self.ledger, store_name, store
        )
        built = scenario.build(world)
        self.router, self.kinds = built.router, list(built.kinds)
        self.jobs = {job.name: job for job in built.jobs}
        self.fleet = Fleet(FLEET_SIZE, self.schedule_rng, self._executor, self._skew)
        self.dispatcher = DeliverySender(engine, self.fleet, plan, self.fault_rng, self.trace)
        self.queue = SimulatedQueue(
            engine,
            self.dispatcher,
            self.history,
            self.trace,
            self.schedule_rng,
            retry=QUEUE_RETRY,
            classify=scenario.classify,
        )
        self.scheduler = SimulatedScheduler(
            engine, self.dispatcher, self.history, self.trace, self.schedule_rng
        )
        self.producer = producer_for(self.queue, engine)
        self.previous_producer = self.router.use_producer(self.producer)
        self.outbox: SimulatedOutbox | None = None
        outbox = (
            outbox_world(store, engine, random.Random(f"{seed}/outbox"), self.producer)
            if "outbox" in self.kinds
            else None
        )
        if outbox is not None:
            self.outbox = SimulatedOutbox(
                outbox,
                engine,
                history=self.history,
                trace=self.trace,
                producer=self.producer,
                running=lambda: not self.dispatcher.closed,
            )
            self.outbox.start()
        engine.pause_hook = self._instance_faults
        self.started = 0
        self.fired: dict[str, set[int]] = {name: set() for name in self.jobs}

    # --- instances ----------------------------------------------------------------------

    def _skew(self) -> timedelta:
        if not self.plan.on("clock_skew") or not self.trace.fires("clock_skew"):
            return timedelta(0)
        self.trace.fault("clock_skew")  # Each instance's clock is off from the others'.
        bound = self.plan.max_clock_skew.total_seconds()
        return timedelta(seconds=self.fault_rng.uniform(0.0, bound))

    def _executor(self, instance: Instance) -> Executor:
        engine = self.engine

        def clock() -> datetime:
            return EPOCH + timedelta(seconds=engine.now) + instance.skew

        attempts: dict[Actor, Attempt] = {}
        return _ObservedExecutor(
            self.router,
            self.store,
            NoAuth(),
            clock=clock,
            timing=Timing(monotonic=lambda: engine.now, sleep=engine.sleep),
            attempt_ids=lambda: f"{self.id_rng.getrandbits(128):032x}",
            lease_keeper=_SimulatedLeaseKeeper(engine, self.store, clock, instance, attempts),
            engine=engine,
            history=self.history,
            attempts=attempts,
        )

    def _instance_faults(self, actor: Actor) -> None:
        instance = actor.instance
        if instance is None or instance.killed:
            return
        rng, plan = self.fault_rng, self.plan
        if plan.on("kill") and rng.random() < plan.kill and self.trace.fires("kill"):
            instance.killed = True
            self.trace.fault("kill", instance.name)
        elif plan.on("stall") and rng.random() < plan.stall and self.trace.fires("stall"):
            seconds = rng.uniform(0.5, 2.5) * LEASE.total_seconds()
            instance.stalled_until = max(instance.stalled_until, self.engine.now + seconds)
            self.trace.fault("stall", f"{instance.name} for {seconds:.3f}s")

    # --- lifecycles ---------------------------------------------------------------------

    def run(self, lifecycles: int) -> SimulationReport:
        engine, rng = self.engine, self.arrival_rng
        kinds, gap = self.kinds, self.scenario.arrival_gap
        at = 0.0
        for number in range(lifecycles):
            at = math.ceil(at + rng.expovariate(1.0 / gap))
            kind = rng.choice(kinds)
            engine.at_time(at, self.scenario.starter(self, kind, number, at))
        last_start = at
        engine.run(until=last_start + SETTLE_WITHIN)
        self.history.ended_at = engine.now
        self.dispatcher.closed = True
        for instance, _ in self.fleet.instances:
            instance.killed = True  # Whatever still waits unwinds, writing nothing.
        engine.run(until=math.inf)
        self.history.crashes = [
            f"{actor.name}: {type(actor.crash).__name__}: {actor.crash}"
            for actor in engine.crashed
            if actor.crash is not None and not isinstance(actor.crash, Killed)
        ]
        if self.ledger is not None:
            self.history.ledger = self.ledger.rows()
        replay = self.scenario.replay(self.history.store, self.seed, lifecycles, self.plan)
        found = tuple(check(self.history))
        return SimulationReport(
            seed=self.seed,
            store=self.history.store,
            lifecycles=lifecycles,
            deliveries=self.dispatcher.deliveries,
            faults=dict(sorted(self.trace.faults.items())),
            violations=tuple(v.describe(replay) for v in found),
            trace_hash=self.trace.digest,
            events=self.trace.events,
            virtual_seconds=self.history.ended_at,
            found=found,
            fired=tuple(self.trace.fired),
            trace=tuple(self.trace.kept or ()),
        )

    def unused_slot(self, job: ScheduledJob, second: int) -> float:
        """The first whole second from ``second`` no lifecycle of ``job`` has used."""
        while second in self.fired[job.name]:
            second += 1
        self.fired[job.name].add(second)
        return float(second)

    def start_user(self, call: Callable[[], None]) -> None:
        """A user's call (an enqueue), as an actor of no instance: it is never killed."""
        self.engine.spawn(f"user{self.started}", None, call)
        self.started += 1

    def close(self) -> None:
        self.router.use_producer(self.previous_producer)
        if self.ledger is not None:
            self.ledger.close()
        if self.outbox is not None:
            self.outbox.close()
        self.store.close()


def _name_of(factory: Callable[[], LeaseStore]) -> str:
    name = getattr(factory, "__name__", type(factory).__name__)
    return name.removesuffix("Store").lower() or "store"


@contextmanager
def _quiet() -> Iterator[None]:
    """The executor logs every delivery: a simulation's thousands stay out of the output."""
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(before)
