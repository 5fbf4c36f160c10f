"""What the simulation's effects left behind, as an independent checker reads it: the writes
handlers made to a fenced downstream, the rows their transactions committed to a ledger, and
the queue's and the scheduler's own logs, what the simulated users know of their own enqueues
(the outbox transactions they committed or rolled back, the enqueues and fan-outs answered), and
the step bodies handlers ran, the fan-outs with a join that returned and what each execution of
a join's ``then`` handler was given, and of each run that waits for a signal: when it
suspended, what each resumed execution saw, and the signals its user sent, with their answers;
of each run a user cancels: each execution's start (and its fan-out children's), and each
cancel call with its answer. Nothing here is read from tasklease's run records."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tasklease.testing.simulation.ledgers import LedgerRow

__all__ = [
    "Answer",
    "CancelCall",
    "CancellableStarted",
    "Enqueued",
    "FanInPlan",
    "History",
    "Origin",
    "OutboxTransaction",
    "Refusal",
    "Resumed",
    "SignalCall",
    "StepBody",
    "Suspended",
    "ThenRun",
    "Write",
]


@dataclass
class Origin:
    """One lifecycle: a task the queue holds, a scheduler slot, or a manual run, and what the
    queue (or the scheduler) saw of it."""

    name: str  # "task:<task id>", "slot:<job>@<time>", "manual:<job>#<n>"
    kind: str  # "task", "slot", "manual"
    handler: str
    transactional: bool = False
    created_at: float = 0.0
    deliveries: int = 0
    acknowledged_at: float | None = None  # The first 2xx the queue heard.
    given_up: bool = False  # Out of retries without a 2xx.
    resources: tuple[str, ...] = ()  # Locks its handler writes under, besides its own run.
    # The run a continued handler said it delivers (each continuation's task is an origin of
    # its own), or a waiting run's: the origins of one run share its idempotency key.
    run: str | None = None
    # A task that wakes a waiting run (its header names the run): "signal" or "timeout".
    wakes: str | None = None
    # The run that fanned this task out, as its header names it (X-Tasklease-Parent).
    parent: str | None = None


@dataclass(frozen=True)
class Write:
    """One call a handler made to the downstream: a fenced write of one step of its effect."""

    at: float
    origin: str
    resource: str  # What the write is fenced on: the origin's run, or a lock.
    attempt_id: str
    token: int
    key: str  # The idempotency key the handler presented (ctx.idempotency_key).
    step: int
    final: bool  # The last step of the handler's effect.
    valid: bool  # Whether the attempt's lease held by its own clock when the write arrived.
    accepted: bool  # Whether the downstream's fence let it through.


@dataclass(frozen=True)
class Answer:
    """An HTTP answer that reached the queue."""

    at: float
    origin: str
    status: int


@dataclass(frozen=True)
class Refusal:
    """An attempt's answer that its claim was taken over (``lost_claim``), and whether, by the
    attempt's own clock, its lease still held when it answered so."""

    at: float
    origin: str
    attempt_id: str
    holding: bool


@dataclass(frozen=True)
class Enqueued:
    """A task the producer answered as created (or already there): a user's enqueue, or a
    child of a handler's fan-out that returned. Its task must reach the queue."""

    at: float
    task_id: str
    by: str  # "user", or the origin of the handler that fanned out.


@dataclass(frozen=True)
class OutboxTransaction:
    """A user's transaction that staged one enqueue in the outbox, and how it ended as the
    user saw it: committed (its task must reach the queue) or rolled back (it must not)."""

    at: float
    task_id: str
    committed: bool


@dataclass(eq=False)
class StepBody:
    """One call of a durable step's body by an attempt; ``returned`` once the body returned
    (its record may still not have been committed)."""

    at: float
    origin: str
    run_id: str
    attempt_id: str
    step: str
    returned: bool = False


@dataclass(frozen=True)
class FanInPlan:
    """A fan-out with a join, as the parent handler saw it return: its run, each child's item
    key and task id, and the keys the children were told to fail for good."""

    at: float
    origin: str
    parent_run_id: str
    children: Mapping[str, str]  # Item key -> the child's task id.
    failing: frozenset[str]


@dataclass(frozen=True)
class ThenRun:
    """One execution of a join's ``then`` handler, and what its payload said: the join's
    parent run, the summary, the results (key, status, result, error) and ``next_after``."""

    at: float
    origin: str
    attempt_id: str
    parent_run_id: str
    summary: Mapping[str, Any]
    results: tuple[Mapping[str, Any], ...]
    next_after: str | None


@dataclass(frozen=True)
class Suspended:
    """An execution of a waiting handler that suspended on its wait (``WaitSuspended``), and
    the timeout it asked for (seconds; None: none)."""

    at: float
    origin: str
    run_id: str
    attempt_id: str
    timeout: float | None


@dataclass(frozen=True)
class Resumed:
    """An execution of a waiting handler past its wait, and what resolved it: the signal's
    payload, or the timeout (``timed_out``, payload None)."""

    at: float
    origin: str
    run_id: str
    attempt_id: str
    timed_out: bool
    payload: Any = None

    @property
    def resolution(self) -> str:
        """The resolution as text: ``timeout``, or the payload's JSON."""
        return "timeout" if self.timed_out else json.dumps(self.payload, sort_keys=True)


@dataclass(frozen=True)
class SignalCall:
    """One call a simulated user made to ``tasklease.signal``, in the order they were made:
    its answer (True: the run gets the signal), or None when it raised (``error``), which
    may or may not have recorded the signal."""

    sent_at: float
    at: float  # When the answer (or the error) came back.
    run_id: str
    payload: Any
    accepted: bool | None
    error: str = ""


@dataclass(frozen=True)
class CancellableStarted:
    """An execution of the cancel workload's handler (or of a child it fanned out) at its
    start, and when its attempt claimed the run by its instance's clock (its lease's expiry
    less the lease), in virtual seconds; ``parent_run_id`` for a child."""

    at: float
    origin: str
    run_id: str
    attempt_id: str
    claimed: float
    parent_run_id: str | None = None


@dataclass(frozen=True)
class CancelCall:
    """One call a simulated user made to cancel a run, in the order they were made: its
    answer (True: the run is, or will be, cancelled), or None when it raised (``error``),
    which may or may not have cancelled it."""

    sent_at: float
    at: float  # When the answer (or the error) came back.
    run_id: str
    accepted: bool | None
    error: str = ""


@dataclass
class History:
    """Everything :func:`~tasklease.testing.simulation.checker.check` reads."""

    seed: int
    store: str
    origins: dict[str, Origin] = field(default_factory=dict)
    writes: list[Write] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    ledger: list[LedgerRow] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    enqueued: list[Enqueued] = field(default_factory=list)
    outbox: list[OutboxTransaction] = field(default_factory=list)
    step_bodies: list[StepBody] = field(default_factory=list)  # In the order they ran.
    fan_ins: list[FanInPlan] = field(default_factory=list)
    then_runs: list[ThenRun] = field(default_factory=list)
    waiters: dict[str, str] = field(default_factory=dict)  # A wait lifecycle -> its run id.
    suspensions: list[Suspended] = field(default_factory=list)
    resumptions: list[Resumed] = field(default_factory=list)
    signals: list[SignalCall] = field(default_factory=list)
    cancellables: dict[str, str] = field(default_factory=dict)  # A cancel lifecycle -> its run.
    starts: list[CancellableStarted] = field(default_factory=list)
    cancels: list[CancelCall] = field(default_factory=list)
    # How far ahead of virtual time an instance's clock may be (0 without clock skew).
    max_clock_skew: float = 0.0
    crashes: list[str] = field(default_factory=list)  # Exceptions that escaped real code.
    ended_at: float = 0.0
