"""``simulate()``: one seeded run of Cloud Tasks, Cloud Scheduler, worker instances and a
store on virtual time, its history checked by
:func:`~tasklease.testing.simulation.checker.check`."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from tasklease.emulator.policy import RetrySettings
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
from tasklease.testing.simulation.history import Enqueued, History
from tasklease.testing.simulation.ledgers import ledger_for
from tasklease.testing.simulation.outbox import SimulatedOutbox, outbox_path
from tasklease.testing.simulation.replay import replay_command
from tasklease.testing.simulation.workload import (
    LEASE,
    LIFECYCLE_KINDS,
    MANUAL_LEAD,
    NEEDS_TRANSACTIONS,
    Downstream,
    Workload,
    build_router,
    classify,
    lifecycle,
    producer_for,
)
from tasklease.worker.auth.authenticators import NoAuth
from tasklease.worker.delivery.executor import Executor
from tasklease.worker.delivery.lease import first_renewal_due, renew_once
from tasklease.worker.handlers.attempt import Attempt
from tasklease.worker.runtime.clock import Timing
from tasklease.worker.stores.base.store import LeaseStore
from tasklease.worker.stores.base.transactional import TransactionalStore

__all__ = ["SimulationReport", "simulate"]

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


def simulate(
    store_factory: Callable[[], LeaseStore],
    *,
    seed: int,
    lifecycles: int,
    faults: Iterable[str] | FaultPlan | None = None,
    workload: Iterable[str] | Workload | None = None,
    store_name: str | None = None,
    keep_trace: bool = False,
) -> SimulationReport:
    """Run ``lifecycles`` lifecycles of the real executor and ``store_factory()``'s store under
    the faults the ``seed`` draws (default: every kind of :data:`FAULT_KINDS`), and check
    the history. The same seed gives the same trace, in any process."""
    if lifecycles < 1:
        raise ValueError(f"lifecycles must be at least 1, not {lifecycles}")
    plan = (
        faults
        if isinstance(faults, FaultPlan)
        else FaultPlan.only(FAULT_KINDS if faults is None else faults)
    )
    chosen = (
        workload
        if isinstance(workload, Workload)
        else (Workload.only(workload) if workload is not None else Workload())
    )
    name = store_name or _name_of(store_factory)
    with _quiet():
        run = _Simulation(
            store_factory(), name, seed, plan=plan, workload=chosen, keep_trace=keep_trace
        )
        try:
            return run.run(lifecycles)
        finally:
            run.close()


class _SimulatedLeaseKeeper:
    """Renews leases as the threaded keeper does (:func:`renew_once`), on virtual timers:
    each kept execution gets a renewal actor on its own instance."""

    def __init__(
        self, engine: Engine, store: LeaseStore, clock: Callable[[], datetime], instance: Instance
    ) -> None:
        self.engine, self.store, self.clock, self.instance = engine, store, clock, instance

    @contextmanager
    def kept(
        self, live: Attempt, lease: timedelta, *, keep_for: timedelta | None = None
    ) -> Iterator[None]:
        engine = self.engine
        kept = [True]
        origin = engine.current_actor()

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


class _Simulation:
    def __init__(
        self,
        store: LeaseStore,
        store_name: str,
        seed: int,
        *,
        plan: FaultPlan,
        workload: Workload,
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
        kinds = workload.kinds if self.ledger is not None else workload.kinds - NEEDS_TRANSACTIONS
        path = outbox_path(store)
        if path is None:
            kinds -= {"outbox"}
        if not kinds:
            raise ValueError(
                f"the {store_name} store runs none of the workload kinds asked for: "
                f"{', '.join(sorted(NEEDS_TRANSACTIONS))} needs a store with transactions; "
                "ask for another kind too"
            )
        self.asked_kinds = workload.kinds
        self.workload = Workload(kinds, workload.arrival_gap, workload.max_steps)
        self.history = History(seed, store_name)
        self.store_faults = StoreFaults(engine, store, plan, self.fault_rng, self.trace)
        downstream = Downstream(engine, self.history, self.trace, self.work_rng)
        self.router, jobs = build_router(
            self.workload, downstream, self.ledger, engine, self.work_rng
        )
        self.jobs = {job.name: job for job in jobs}
        self.fleet = Fleet(FLEET_SIZE, self.schedule_rng, self._executor, self._skew)
        self.dispatcher = DeliverySender(engine, self.fleet, plan, self.fault_rng, self.trace)
        self.queue = SimulatedQueue(
            engine,
            self.dispatcher,
            self.history,
            self.trace,
            self.schedule_rng,
            retry=QUEUE_RETRY,
            classify=classify,
        )
        self.scheduler = SimulatedScheduler(
            engine, self.dispatcher, self.history, self.trace, self.schedule_rng
        )
        self.producer = producer_for(self.queue, engine)
        self.previous_producer = self.router.use_producer(self.producer)
        self.outbox: SimulatedOutbox | None = None
        if path is not None and "outbox" in kinds:
            self.outbox = SimulatedOutbox(
                path,
                engine,
                history=self.history,
                trace=self.trace,
                rng=random.Random(f"{seed}/outbox"),
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

        return Executor(
            self.router,
            self.store,
            NoAuth(),
            clock=clock,
            timing=Timing(monotonic=lambda: engine.now, sleep=engine.sleep),
            attempt_ids=lambda: f"{self.id_rng.getrandbits(128):032x}",
            lease_keeper=_SimulatedLeaseKeeper(engine, self.store, clock, instance),
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
        kinds = sorted(self.workload.kinds)
        at = 0.0
        for number in range(lifecycles):
            at = math.ceil(at + rng.expovariate(1.0 / self.workload.arrival_gap))
            kind = rng.choice(kinds)
            engine.at_time(at, self._starter(kind, number, at))
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
        replay = replay_command(
            self.history.store, self.seed, lifecycles, self.plan, self.asked_kinds
        )
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

    def _starter(self, kind: str, number: int, at: float) -> Callable[[], None]:
        rng = self.arrival_rng
        steps = rng.randint(1, self.workload.max_steps)
        twice = rng.random() < 0.2

        def enqueue(task: str, payload: object, key: str) -> Callable[[], None]:
            def user() -> None:
                result = self.producer.enqueue(task, payload, key=key)
                self.history.enqueued.append(Enqueued(self.engine.now, result.task_id, "user"))
                if twice:  # The same key again: Cloud Tasks refuses the name, nothing new.
                    self.producer.enqueue(task, payload, key=key)

            return lambda: self._user(user)

        if kind in LIFECYCLE_KINDS:
            return lifecycle(
                kind,
                number,
                rng,
                steps=steps,
                enqueue=enqueue,
                outbox=self.outbox,
                user=self._user,
            )
        if kind == "keyed_task":
            return enqueue("effect", {"steps": steps}, f"e{number}")
        if kind == "concurrency_key":
            key = f"k{rng.randrange(3)}"
            return enqueue("keyed", {"key": key, "steps": steps}, f"c{number}")
        if kind == "transactional":
            return enqueue("ledger", {}, f"l{number}")
        if kind in ("scheduled_job", "exclusive_job"):
            job = self.jobs["job" if kind == "scheduled_job" else "exclusive"]
            slot = self._unused_slot(job, math.ceil(at))
            return lambda: self.scheduler.fire_slot(job, slot)
        assert kind == "manual_run", kind
        job = self.jobs["job"]
        next_slot = self._unused_slot(job, math.ceil(at + rng.uniform(*MANUAL_LEAD)))
        return lambda: self.scheduler.run_now(job, next_slot)

    def _unused_slot(self, job: ScheduledJob, second: int) -> float:
        """The first whole second from ``second`` no lifecycle of ``job`` has used."""
        while second in self.fired[job.name]:
            second += 1
        self.fired[job.name].add(second)
        return float(second)

    def _user(self, call: Callable[[], None]) -> None:
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
