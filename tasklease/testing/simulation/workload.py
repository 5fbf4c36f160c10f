"""What the simulated users do: the handlers of the simulation's router, the effects they
have, and the lifecycles the seed starts (tasks by key, scheduler slots, manual runs, ...).

Each handler does its work in steps, each step a write to the :class:`Downstream`, fenced by
the attempt's token (the run's, or its lock's) as a careful user's third-party call is, and
presenting ``ctx.idempotency_key``. A transactional handler writes its effect to the ledger
inside its transaction instead; so does each durable step of the ``steps`` handler, in the
step's own transaction (``ctx.step(..., transactional=True)``): a step's ledger row commits
exactly when its step record does.

The ``waits`` handler makes one fenced write in a durable step, waits for its user's signal
(``ctx.wait_for``, with a seeded timeout or none), and makes its final write once the wait
resolves; its user (:mod:`~tasklease.testing.simulation.signalling`) signals the run zero,
one or two times, before the handler reaches its wait, while it waits, or long after.

The ``cancel`` handler notes its start, optionally fans out a couple of children (each notes
its start, then writes), and runs a few durable steps, each body noting it started, then
making a fenced write; it may wait (``ctx.wait_for``, never signalled, with a timeout) between
two steps. Its user (:mod:`~tasklease.testing.simulation.cancelling`) cancels the run before
its first step, while it runs, while it waits, long after it ended, or never.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from tasklease import protocol
from tasklease.errors import LeaseLost, PermanentFailure
from tasklease.producer import Producer
from tasklease.producer.transport import TaskRequest
from tasklease.testing.simulation.cloud import QUEUE_PATH, WORKER_URL, ScheduledJob
from tasklease.testing.simulation.engine import EPOCH, Engine
from tasklease.testing.simulation.faults import Trace
from tasklease.testing.simulation.history import (
    CancellableStarted,
    Enqueued,
    FanInPlan,
    History,
    Origin,
    Resumed,
    StepBody,
    Suspended,
    ThenRun,
    Write,
)
from tasklease.testing.simulation.ledgers import EffectLedger, LedgerRow
from tasklease.testing.simulation.outbox import OUTBOX_HANDLER, SimulatedOutbox
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.handlers.waits import WaitSuspended, WaitTimedOut

__all__ = [
    "CANCELLABLE",
    "CANCELLABLE_CHILD",
    "FAN_IN_CHILD",
    "FAN_IN_PARENT",
    "FAN_IN_THEN",
    "LEASE",
    "LIFECYCLE_KINDS",
    "STEP_EFFECT",
    "WAITER",
    "WAIT_NAME",
    "WORKLOAD_KINDS",
    "Downstream",
    "Workload",
    "build_router",
    "lifecycle",
]

# Every kind of lifecycle the simulation knows; by default all the store supports are on.
WORKLOAD_KINDS = (
    "keyed_task",  # A task enqueued by key, sometimes twice (the second creates nothing).
    "concurrency_key",  # A task whose key allows one run at a time.
    "scheduled_job",  # A scheduler slot of a plain job, retried by the scheduler.
    "manual_run",  # `gcloud scheduler jobs run` of that job: a run of its own.
    "exclusive_job",  # A slot of an exclusive job: one run at a time, overlaps skipped.
    "transactional",  # A task whose effect commits with its completion (needs transactions).
    "outbox",  # A user's transaction stages an enqueue, commits or rolls back (not memory).
    "steps",  # A task of durable steps, each committing a ledger row (needs transactions).
    "continuation",  # A task that continues itself (ctx.continue_later) a seeded number of times.
    "fan_out",  # A task that fans out child tasks (Producer.fan_out), then writes.
    "fan_in",  # A fan-out with then= (some children fail for good) and its then handler.
    "waits",  # A task that waits for its user's signal (ctx.wait_for), or its timeout.
    "cancel",  # A task of steps (a fan-out, a wait) its user cancels at a seeded time.
)
NEEDS_TRANSACTIONS = frozenset({"transactional", "outbox", "steps"})
NEEDS_FAN_INS = frozenset({"fan_in"})  # Needs a store that keeps joins (FanInStore).

LEASE = timedelta(seconds=30)
# A manual run carries the next slot's time; one sent at least this long before it stays
# unmistakably manual through all its retries (the worker's margin is 60 s by default).
MANUAL_LEAD = (1200.0, 3600.0)
CONCURRENCY_KEYS = 3
# The kinds whose lifecycles :func:`lifecycle` starts.
LIFECYCLE_KINDS = frozenset(
    {"outbox", "steps", "continuation", "fan_out", "fan_in", "waits", "cancel"}
)
STEP_EFFECT = "step:"  # A ledger row's effect for a durable step: "step:<name>".
OUTBOX_COMMITS = 0.7  # The share of outbox transactions the user commits.
# The fan-in workload's handlers: the parent, its children, and the join's then handler.
FAN_IN_PARENT, FAN_IN_CHILD, FAN_IN_THEN = "joiner", "member", "joined"
FAN_IN_CHILDREN = (1, 6)
FAN_IN_FAILS = 0.25  # The share of a join's children told to fail for good.
# The waits workload's handler and its wait; a wait's timeout in whole seconds (or none), and
# when its user signals (seconds after the run started; the second a duplicate, seconds after
# the first's answer).
WAITER, WAIT_NAME = "waiter", "w"
WAIT_TIMEOUT = (60, 900)
NO_TIMEOUT = 0.3  # The share of waits with no timeout.
SIGNAL_WHEN = (  # (share, delay range) of the first signal; the rest never signal.
    (0.3, (0.0, 3.0)),  # Most before the handler reaches its wait.
    (0.3, (5.0, 120.0)),  # While it waits.
    (0.25, (300.0, 1500.0)),  # Long after: some after the wait's timeout.
)
SECOND_SIGNAL = 0.4  # The share of users who signal again, with another payload.
SECOND_AFTER = (0.0, 30.0)
# The cancel workload's handler, its children's and its wait (never signalled); how many
# steps, children and what timeout; and when its user cancels (seconds after the run started).
CANCELLABLE, CANCELLABLE_CHILD, CANCEL_WAIT = "cancellable", "cancellable_child", "c"
CANCEL_STEPS, CANCEL_CHILDREN, CANCEL_TIMEOUT = (2, 4), (1, 2), (60, 600)
CANCEL_FANS_OUT, CANCEL_WAITS = 0.5, 0.4  # The shares of runs that fan out, that wait.
CANCEL_WHEN = (  # (share, delay range) of the cancellation; the rest are never cancelled.
    (0.2, (0.0, 0.0)),  # Before its first step.
    (0.3, (0.5, 8.0)),  # While it runs.
    (0.2, (20.0, 300.0)),  # While it waits (or, for one that does not, after it ended).
    (0.15, (1000.0, 2000.0)),  # Long after it ended.
)


@dataclass(frozen=True)
class Workload:
    """The kinds of lifecycle a simulation starts (default: all), and how they arrive."""

    kinds: frozenset[str] = frozenset(WORKLOAD_KINDS)
    arrival_gap: float = 2.0  # Mean virtual seconds between two new lifecycles.
    max_steps: int = 3  # Most downstream writes one handler makes.

    @classmethod
    def only(cls, kinds: Iterable[str]) -> Workload:
        """A workload of just ``kinds`` (ValueError naming any unknown one)."""
        chosen = frozenset(kinds)
        unknown = sorted(chosen - set(WORKLOAD_KINDS))
        if unknown:
            raise ValueError(
                f"unknown workload kind(s) {', '.join(unknown)}: "
                f"choose from {', '.join(WORKLOAD_KINDS)}"
            )
        return cls(kinds=chosen)


@dataclass
class Downstream:
    """A third-party system the handlers call: it keeps, per resource, the highest fencing
    token it has seen and refuses a write with a lower one (a careful user's fence)."""

    engine: Engine
    history: History
    trace: Trace
    rng: random.Random
    highest: dict[str, int] = field(default_factory=dict)

    def write(
        self,
        ctx: TaskContext,
        *,
        resource: str,
        token: int,
        step: int,
        final: bool,
        key: str | None = None,
    ) -> None:
        """One step of the handler's effect, presenting ``key`` (default:
        ``ctx.idempotency_key``). Raises :class:`LeaseLost` (after recording the refused
        write) when the attempt's own clock says its lease ran out on the way."""
        self.engine.pause(self.rng.uniform(0.001, 0.05))  # The request on its way.
        actor = self.engine.current_actor()
        origin = actor.origin if actor is not None and actor.origin else "?"
        valid = not ctx.lease_lost
        accepted = token >= self.highest.get(resource, -1)
        if accepted:
            self.highest[resource] = token
        self.history.writes.append(
            Write(
                self.engine.now,
                origin,
                resource,
                ctx.attempt_id,
                token,
                ctx.idempotency_key if key is None else key,
                step,
                final,
                valid,
                accepted,
            )
        )
        self.trace.note(f"write {resource[-16:]} step {step} token {token} {valid} {accepted}")
        if not valid:
            raise LeaseLost(f"run {ctx.run_id}: the lease ran out before step {step}")
        self.engine.pause(self.rng.uniform(0.001, 0.05))  # The answer on its way back.


def build_router(
    workload: Workload,
    downstream: Downstream,
    ledger: EffectLedger | None,
    engine: Engine,
    rng: random.Random,
) -> tuple[Router, list[ScheduledJob]]:
    """The simulation's router, and the scheduler jobs it serves."""
    router = Router()

    def work(ctx: TaskContext, resource: str, token: int, steps: int) -> None:
        for step in range(steps):
            ctx.check_lease()
            engine.pause(rng.uniform(0.05, 3.0))  # The handler's own work.
            downstream.write(
                ctx, resource=resource, token=token, step=step, final=step == steps - 1
            )

    def origin_of() -> str:
        actor = engine.current_actor()
        return actor.origin if actor is not None and actor.origin else "?"

    @router.task("effect", lease=LEASE)
    def effect(payload: dict[str, Any], ctx: TaskContext) -> dict[str, int]:
        work(ctx, origin_of(), ctx.fencing_token, int(payload["steps"]))
        return {"steps": int(payload["steps"])}

    @router.task("keyed", lease=LEASE, concurrency_key=lambda payload: payload["key"])
    def keyed(payload: dict[str, Any], ctx: TaskContext) -> None:
        assert ctx.lock is not None and ctx.lock_fencing_token is not None
        work(ctx, ctx.lock, ctx.lock_fencing_token, int(payload["steps"]))

    @router.scheduled("job", lease=LEASE)
    def job(ctx: TaskContext) -> None:
        work(ctx, origin_of(), ctx.fencing_token, 2)

    @router.scheduled("exclusive", lease=LEASE, exclusive=True)
    def exclusive(ctx: TaskContext) -> None:
        assert ctx.lock is not None and ctx.lock_fencing_token is not None
        work(ctx, ctx.lock, ctx.lock_fencing_token, 2)

    if ledger is not None:

        @router.task("ledger", lease=LEASE, transactional=True)
        def in_ledger(payload: dict[str, Any], ctx: TaskContext) -> None:
            ledger.write(ctx.transaction, LedgerRow(ctx.run_id, ctx.attempt_id, origin_of()))

    _lifecycle_handlers(
        router,
        downstream=downstream,
        ledger=ledger,
        engine=engine,
        rng=rng,
        work=work,
        origin_of=origin_of,
    )
    jobs = [
        ScheduledJob("job", retry_count=3),
        ScheduledJob("exclusive", retry_count=2, resources=("exclusive",)),
    ]
    return router, jobs


def _lifecycle_handlers(
    router: Router,
    *,
    downstream: Downstream,
    ledger: EffectLedger | None,
    engine: Engine,
    rng: random.Random,
    work: Callable[[TaskContext, str, int, int], None],
    origin_of: Callable[[], str],
) -> None:
    """The handlers of :data:`LIFECYCLE_KINDS` (``steps`` only with a ledger)."""
    _fan_in_handlers(
        router, downstream=downstream, ledger=ledger, engine=engine, work=work, origin_of=origin_of
    )
    _waiting_handler(router, downstream=downstream, engine=engine, rng=rng, origin_of=origin_of)
    _cancellable_handlers(
        router, downstream=downstream, engine=engine, rng=rng, work=work, origin_of=origin_of
    )

    @router.task(OUTBOX_HANDLER, lease=LEASE)
    def outboxed(payload: dict[str, Any], ctx: TaskContext) -> None:
        work(ctx, origin_of(), ctx.fencing_token, int(payload["steps"]))

    @router.task("fan", lease=LEASE)
    def fan(payload: dict[str, Any], ctx: TaskContext) -> None:
        children = [(str(n), {"steps": 1}) for n in range(int(payload["children"]))]
        # One create at a time: a pool of threads would create them in an order the seed
        # does not decide.
        results = router.producer().fan_out(ctx, "effect", children, concurrency=1)
        by = origin_of()
        for result in results:
            downstream.history.enqueued.append(Enqueued(engine.now, result.task_id, by))
        work(ctx, by, ctx.fencing_token, 1)

    @router.task("continued", lease=LEASE)
    def continued(payload: dict[str, Any], ctx: TaskContext) -> None:
        # Each delivery writes once, fenced on the run its deliveries share.
        origin = downstream.history.origins.get(origin_of())
        if origin is not None:
            origin.run = ctx.run_id
        work(ctx, f"run:{ctx.run_id}", ctx.fencing_token, 1)
        if ctx.continuation < int(payload["times"]):
            # No delay: the producer turns one into a schedule time by the real clock.
            ctx.continue_later({"after": ctx.continuation})

    if ledger is None:
        return
    step_ledger: EffectLedger = ledger

    @router.task("steps", lease=LEASE)
    def steps(payload: dict[str, Any], ctx: TaskContext) -> None:
        origin = origin_of()

        def body(transaction: Any, name: str) -> str:
            # Nothing pauses here: the step holds the store's transaction.
            ran = StepBody(engine.now, origin, ctx.run_id, ctx.attempt_id, name)
            downstream.history.step_bodies.append(ran)
            row = LedgerRow(ctx.run_id, ctx.attempt_id, f"{STEP_EFFECT}{name}")
            step_ledger.write(transaction, row)
            ran.returned = True
            return name

        for number in range(int(payload["steps"])):
            ctx.check_lease()
            engine.pause(rng.uniform(0.05, 3.0))  # The handler's own work.
            ctx.step(f"s{number}", body, f"s{number}", transactional=True)
        work(ctx, origin, ctx.fencing_token, 1)


def _fan_in_handlers(
    router: Router,
    *,
    downstream: Downstream,
    ledger: EffectLedger | None,
    engine: Engine,
    work: Callable[[TaskContext, str, int, int], None],
    origin_of: Callable[[], str],
) -> None:
    """The fan-in workload's handlers. Each child writes its effect, then returns the id of
    the attempt that wrote it, or (told to) fails for good naming it; the then handler notes
    what it was given and makes its effect: a ledger row in its transaction on a store with
    transactions, else a fenced write."""
    history = downstream.history

    @router.task(FAN_IN_PARENT, lease=LEASE)
    def joiner(payload: dict[str, Any], ctx: TaskContext) -> None:
        failing = frozenset(f"c{n}" for n in payload["fail"])
        children = [(f"c{n}", {"fail": f"c{n}" in failing}) for n in range(payload["children"])]
        results = ctx.fan_out(FAN_IN_CHILD, children, then=FAN_IN_THEN)
        by = origin_of()
        tasks = {key: result.task_id for (key, _), result in zip(children, results, strict=True)}
        history.enqueued += [Enqueued(engine.now, task_id, by) for task_id in tasks.values()]
        history.fan_ins.append(FanInPlan(engine.now, by, ctx.run_id, tasks, failing))
        work(ctx, by, ctx.fencing_token, 1)

    @router.task(FAN_IN_CHILD, lease=LEASE)
    def member(payload: dict[str, Any], ctx: TaskContext) -> dict[str, str]:
        work(ctx, origin_of(), ctx.fencing_token, 1)
        if payload["fail"]:
            raise PermanentFailure(f"told to fail; attempt {ctx.attempt_id} wrote its effect")
        return {"attempt": ctx.attempt_id}

    @router.task(FAN_IN_THEN, lease=LEASE, transactional=ledger is not None)
    def joined(payload: dict[str, Any], ctx: TaskContext) -> None:
        origin = origin_of()
        ran = ThenRun(
            engine.now,
            origin,
            ctx.attempt_id,
            payload["parent_run_id"],
            payload["summary"],
            tuple(payload["results"]),
            payload["next_after"],
        )
        history.then_runs.append(ran)
        if ledger is not None:  # Nothing pauses here: the handler holds the transaction.
            ledger.write(ctx.transaction, LedgerRow(ctx.run_id, ctx.attempt_id, origin))
        else:
            work(ctx, origin, ctx.fencing_token, 1)


def _waiting_handler(
    router: Router,
    *,
    downstream: Downstream,
    engine: Engine,
    rng: random.Random,
    origin_of: Callable[[], str],
) -> None:
    """The waits workload's handler. It notes its run's id for its user, makes its pre-wait
    write in the durable step ``asked`` (which must never run again once the run waits), waits,
    notes each suspension and each resumed execution with what resolved the wait, and makes
    its final write. Both writes are fenced on the run."""
    history = downstream.history

    @router.task(WAITER, lease=LEASE)
    def waiter(payload: dict[str, Any], ctx: TaskContext) -> None:
        by = origin_of()
        origin = history.origins.get(by)
        if origin is not None:
            origin.run = ctx.run_id
        history.waiters.setdefault(payload["lifecycle"], ctx.run_id)
        resource = f"run:{ctx.run_id}"

        def ask() -> str:
            ran = StepBody(engine.now, by, ctx.run_id, ctx.attempt_id, "asked")
            history.step_bodies.append(ran)
            downstream.write(ctx, resource=resource, token=ctx.fencing_token, step=0, final=False)
            ran.returned = True
            return "asked"

        ctx.step("asked", ask)
        timeout = payload["timeout"]
        try:
            answer = ctx.wait_for(WAIT_NAME, timeout=timeout)
            resumed = Resumed(engine.now, by, ctx.run_id, ctx.attempt_id, False, answer)
        except WaitSuspended:
            history.suspensions.append(
                Suspended(engine.now, by, ctx.run_id, ctx.attempt_id, timeout)
            )
            raise
        except WaitTimedOut:
            resumed = Resumed(engine.now, by, ctx.run_id, ctx.attempt_id, True)
        history.resumptions.append(resumed)
        ctx.check_lease()
        engine.pause(rng.uniform(0.05, 3.0))  # The handler's own work.
        downstream.write(ctx, resource=resource, token=ctx.fencing_token, step=1, final=True)


def _claimed(ctx: TaskContext) -> float:
    """When the attempt claimed its run by its instance's clock, in virtual seconds: its
    lease's expiry less the lease, as its handler sees it at its start."""
    return (ctx.lease_expires - EPOCH - LEASE).total_seconds()


def _cancellable_handlers(
    router: Router,
    *,
    downstream: Downstream,
    engine: Engine,
    rng: random.Random,
    work: Callable[[TaskContext, str, int, int], None],
    origin_of: Callable[[], str],
) -> None:
    """The cancel workload's handlers. The run notes its start (its id for its user), fans
    out its children first when told to, runs its steps (each body noting it started, then
    writing fenced on the run; the last write is its final one), and waits for its timeout
    before the step it is told to. A child notes its start, then writes."""
    history = downstream.history

    @router.task(CANCELLABLE, lease=LEASE)
    def cancellable(payload: dict[str, Any], ctx: TaskContext) -> None:
        by = origin_of()
        origin = history.origins.get(by)
        if origin is not None:
            origin.run = ctx.run_id
        history.cancellables.setdefault(payload["lifecycle"], ctx.run_id)
        history.starts.append(
            CancellableStarted(engine.now, by, ctx.run_id, ctx.attempt_id, _claimed(ctx))
        )
        resource, steps = f"run:{ctx.run_id}", int(payload["steps"])
        if payload["children"]:
            children = [(str(n), {"parent": ctx.run_id}) for n in range(payload["children"])]
            # One create at a time, in the order the seed decides.
            results = router.producer().fan_out(ctx, CANCELLABLE_CHILD, children, concurrency=1)
            history.enqueued += [Enqueued(engine.now, result.task_id, by) for result in results]

        def body(number: int) -> int:
            ran = StepBody(engine.now, by, ctx.run_id, ctx.attempt_id, f"c{number}")
            history.step_bodies.append(ran)
            final = number == steps - 1
            downstream.write(
                ctx, resource=resource, token=ctx.fencing_token, step=number, final=final
            )
            ran.returned = True
            return number

        for number in range(steps):
            if number == payload["wait_at"]:
                _wait_out(ctx, history, engine, by, payload["timeout"])
            ctx.check_lease()
            engine.pause(rng.uniform(0.05, 3.0))  # The handler's own work.
            ctx.step(f"c{number}", body, number)

    @router.task(CANCELLABLE_CHILD, lease=LEASE)
    def cancellable_child(payload: dict[str, Any], ctx: TaskContext) -> None:
        by = origin_of()
        started = CancellableStarted(
            engine.now, by, ctx.run_id, ctx.attempt_id, _claimed(ctx), payload["parent"]
        )
        history.starts.append(started)
        work(ctx, by, ctx.fencing_token, 1)


def _wait_out(ctx: TaskContext, history: History, engine: Engine, by: str, timeout: float) -> None:
    """Wait for a signal that never comes, noting the suspension and the timeout's resume."""
    try:
        ctx.wait_for(CANCEL_WAIT, timeout=timeout)
    except WaitSuspended:
        history.suspensions.append(Suspended(engine.now, by, ctx.run_id, ctx.attempt_id, timeout))
        raise
    except WaitTimedOut:
        history.resumptions.append(Resumed(engine.now, by, ctx.run_id, ctx.attempt_id, True))
        return
    raise AssertionError("the cancel workload's wait is never signalled")


def classify(request: TaskRequest, transactional: frozenset[str] = frozenset({"ledger"})) -> Origin:
    """The lifecycle a task the queue just accepted starts (a continuation's task: one of
    its own, each delivery of the run a lifecycle; a task that wakes a waiting run: one of
    its own, of that run, which its header names); ``transactional``: the handlers whose
    effect is a ledger row."""
    handler = request.url.rsplit("/", 1)[-1]
    origin = Origin(
        f"task:{request.task_id}", "task", handler, transactional=handler in transactional
    )
    # "<run id>:<delivery>:<signal|timeout@<deadline>>:<wait name>", read here as the queue
    # sees it.
    wakes = request.headers.get(protocol.RESUME_HEADER, "").split(":", 3)
    woken_by = wakes[2].split("@", 1)[0] if len(wakes) == 4 else ""
    if woken_by in ("signal", "timeout"):
        origin.run, origin.wakes = wakes[0], woken_by
    origin.parent = request.headers.get(protocol.PARENT_HEADER) or None
    return origin


def lifecycle(
    kind: str,
    number: int,
    rng: random.Random,
    *,
    steps: int,
    enqueue: Callable[[str, object, str], Callable[[], None]],
    outbox: SimulatedOutbox | None,
    user: Callable[[Callable[[], None]], None],
    signaller: Callable[[str, Sequence[float]], Callable[[], None]] | None = None,
    canceller: Callable[[str, float | None], Callable[[], None]] | None = None,
) -> Callable[[], None]:
    """The start of lifecycle ``number`` of one of :data:`LIFECYCLE_KINDS`, its shape drawn
    from ``rng``: ``enqueue(task, payload, key)`` is a user's enqueue, ``user(call)`` runs
    ``call`` as a user, ``signaller(lifecycle, delays)`` is what the user of a waiting run
    does, ``canceller(lifecycle, delay)`` what the user of a cancelled one does."""
    if kind == "cancel":
        assert canceller is not None
        return _cancel_lifecycle(f"x{number}", rng, enqueue=enqueue, user=user, canceller=canceller)
    if kind == "waits":
        assert signaller is not None
        return _waits_lifecycle(f"w{number}", rng, enqueue=enqueue, user=user, signaller=signaller)
    if kind == "outbox":
        assert outbox is not None
        commit = rng.random() < OUTBOX_COMMITS
        return lambda: user(lambda: outbox.user_transaction(f"o{number}", commit))
    if kind == "steps":
        return enqueue("steps", {"steps": steps}, f"s{number}")
    if kind == "continuation":
        return enqueue("continued", {"times": rng.randint(1, 3)}, f"n{number}")
    if kind == "fan_in":
        children = rng.randint(*FAN_IN_CHILDREN)
        failing = [n for n in range(children) if rng.random() < FAN_IN_FAILS]
        return enqueue(FAN_IN_PARENT, {"children": children, "fail": failing}, f"j{number}")
    assert kind == "fan_out", kind
    return enqueue("fan", {"children": rng.randint(1, 4)}, f"f{number}")


def _waits_lifecycle(
    key: str,
    rng: random.Random,
    *,
    enqueue: Callable[[str, object, str], Callable[[], None]],
    user: Callable[[Callable[[], None]], None],
    signaller: Callable[[str, Sequence[float]], Callable[[], None]],
) -> Callable[[], None]:
    """A waiting run's task, and its user's signals after the delays drawn here."""
    timeout = None if rng.random() < NO_TIMEOUT else float(rng.randint(*WAIT_TIMEOUT))
    delays: list[float] = []
    draw, share = rng.random(), 0.0
    for part, between in SIGNAL_WHEN:
        share += part
        if draw < share:
            delays.append(round(rng.uniform(*between), 3))
            break
    if delays and rng.random() < SECOND_SIGNAL:
        delays.append(round(rng.uniform(*SECOND_AFTER), 3))
    start = enqueue(WAITER, {"lifecycle": key, "timeout": timeout}, key)
    signals = signaller(key, delays)

    def both() -> None:
        start()
        user(signals)

    return both


def _cancel_lifecycle(
    key: str,
    rng: random.Random,
    *,
    enqueue: Callable[[str, object, str], Callable[[], None]],
    user: Callable[[Callable[[], None]], None],
    canceller: Callable[[str, float | None], Callable[[], None]],
) -> Callable[[], None]:
    """A cancellable run's task, and its user's cancellation after the delay drawn here."""
    steps = rng.randint(*CANCEL_STEPS)
    children = rng.randint(*CANCEL_CHILDREN) if rng.random() < CANCEL_FANS_OUT else 0
    waits = rng.random() < CANCEL_WAITS
    payload = {
        "lifecycle": key,
        "steps": steps,
        "children": children,
        "wait_at": rng.randint(1, steps - 1) if waits else None,
        "timeout": float(rng.randint(*CANCEL_TIMEOUT)),
    }
    delay: float | None = None
    draw, share = rng.random(), 0.0
    for part, between in CANCEL_WHEN:
        share += part
        if draw < share:
            delay = round(rng.uniform(*between), 3)
            break
    start = enqueue(CANCELLABLE, payload, key)
    cancels = canceller(key, delay)

    def both() -> None:
        start()
        user(cancels)

    return both


def producer_for(transport: Any, engine: Engine) -> Producer:
    """The producer the simulated users enqueue with, over the simulated queue."""
    project, location, queue = QUEUE_PATH.split("/")[1::2]
    return Producer(project, location, queue, WORKER_URL, transport=transport, sleep=engine.sleep)
