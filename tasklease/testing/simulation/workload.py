"""What the simulated users do: the handlers of the simulation's router, the effects they
have, and the lifecycles the seed starts (tasks by key, scheduler slots, manual runs, ...).

Each handler does its work in steps, each step a write to the :class:`Downstream`, fenced by
the attempt's token (the run's, or its lock's) as a careful user's third-party call is, and
presenting ``ctx.idempotency_key``. A transactional handler writes its effect to the ledger
inside its transaction instead.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from tasklease.errors import LeaseLost
from tasklease.producer import Producer
from tasklease.producer.transport import TaskRequest
from tasklease.testing.simulation.cloud import QUEUE_PATH, WORKER_URL, ScheduledJob
from tasklease.testing.simulation.engine import Engine
from tasklease.testing.simulation.faults import Trace
from tasklease.testing.simulation.history import History, Origin, Write
from tasklease.testing.simulation.ledgers import EffectLedger, LedgerRow
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router

__all__ = ["LEASE", "WORKLOAD_KINDS", "Downstream", "Workload", "build_router"]

# Every kind of lifecycle the simulation knows; by default all the store supports are on.
WORKLOAD_KINDS = (
    "keyed_task",  # A task enqueued by key, sometimes twice (the second creates nothing).
    "concurrency_key",  # A task whose key allows one run at a time.
    "scheduled_job",  # A scheduler slot of a plain job, retried by the scheduler.
    "manual_run",  # `gcloud scheduler jobs run` of that job: a run of its own.
    "exclusive_job",  # A slot of an exclusive job: one run at a time, overlaps skipped.
    "transactional",  # A task whose effect commits with its completion (needs transactions).
)
NEEDS_TRANSACTIONS = frozenset({"transactional"})

LEASE = timedelta(seconds=30)
# A manual run carries the next slot's time; one sent at least this long before it stays
# unmistakably manual through all its retries (the worker's margin is 60 s by default).
MANUAL_LEAD = (1200.0, 3600.0)
CONCURRENCY_KEYS = 3


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

    jobs = [
        ScheduledJob("job", retry_count=3),
        ScheduledJob("exclusive", retry_count=2, resources=("exclusive",)),
    ]
    return router, jobs


def classify(request: TaskRequest) -> Origin:
    """The lifecycle a task the queue just accepted starts."""
    handler = request.url.rsplit("/", 1)[-1]
    return Origin(f"task:{request.task_id}", "task", handler, transactional=handler == "ledger")


def producer_for(transport: Any, engine: Engine) -> Producer:
    """The producer the simulated users enqueue with, over the simulated queue."""
    project, location, queue = QUEUE_PATH.split("/")[1::2]
    return Producer(project, location, queue, WORKER_URL, transport=transport, sleep=engine.sleep)
