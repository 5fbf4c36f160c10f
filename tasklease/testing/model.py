"""A bounded model of the delivery protocol, explored exhaustively over the pure rules.

A few attempts (deliveries on instances) of one run, or of two runs sharing one lock, take
the executor's protocol steps in every order: claim with a lease, take the lock, run the
effect, ask for a renewal and have it land later, release the lock, complete / fail /
release, give back. Any attempt may crash at any point (it takes no more steps; its lease
lapses, though a renewal it sent may still land), the true clock advances one tick at a time
(a tick divides the lease's renewal interval and the clock skew), and each instance's wall
clock is ahead of true time by 0 or by the whole skew bound. The store applies each rule
atomically, as every store's contract says: one call is one read-decide-write.

The explorer is a breadth-first search with a visited set, so every violation comes with a
shortest trace to it. It takes the rules as parameters (:class:`Rules`, by default the real
ones of :mod:`tasklease.worker.core`), so a test can plant a bug and see it found.

The invariants are plain functions of what happened (effects, completions, grants, beliefs),
so a checker of recorded histories can apply them too. Only the core and the standard
library are imported: the model does no I/O.

``python -m tasklease.testing.model`` explores the default bounds and prints one line.
"""

from __future__ import annotations

import argparse
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import Enum

from tasklease.worker.core import constants as c
from tasklease.worker.core import decisions, locking
from tasklease.worker.core.records import (
    Claim,
    ClaimRequest,
    LockGrant,
    LockRecord,
    LockRequest,
    RunRecord,
    RunStatus,
    Verdict,
)

__all__ = [
    "Bounds",
    "Completion",
    "Effect",
    "Holder",
    "ModelReport",
    "Rules",
    "Violation",
    "completed_run_claimed_again",
    "effect_repeated_after_completion",
    "effect_while_another_holds",
    "explore",
    "finish_without_the_claim",
    "holders_overlap",
    "token_did_not_grow",
]

# The model's true time 0. Any moment works: the rules depend on differences of times only,
# except lock tokens, which are at least the grant's time in microseconds (next_token).
EPOCH = datetime(2030, 1, 1, tzinfo=UTC)
LOCK_NAME = "job/model"


# --- The rules explored ---------------------------------------------------------------


def _renewable(record: RunRecord | None, attempt_id: str) -> bool:
    """What a store's renewal checks before extending a lease: the attempt holds the claim."""
    return decisions.holds(record, attempt_id)


@dataclass(frozen=True)
class Rules:
    """The pure rules a store applies, as the model calls them; the real ones by default.

    ``renewable`` is the check a renewal makes and ``holds`` the one a finish makes (a store
    makes both with :func:`decisions.holds`). A lock grant that writes a new lock record
    gets its token from ``next_token`` (the real :func:`locking.acquire` already gave it
    that very token).
    """

    claim: Callable[[RunRecord | None, ClaimRequest, datetime], Claim] = decisions.claim
    holds: Callable[[RunRecord | None, str], bool] = decisions.holds
    renewable: Callable[[RunRecord | None, str], bool] = _renewable
    finished_by: Callable[[RunRecord | None, str, RunStatus | None], bool] = decisions.finished_by
    renewed: Callable[[RunRecord, datetime, timedelta | None], RunRecord] = decisions.renewed
    kept: Callable[[RunRecord, datetime, timedelta | None], RunRecord] = decisions.kept
    completed: Callable[[RunRecord, str | None, datetime], RunRecord] = decisions.completed
    released: Callable[[RunRecord, str, datetime], RunRecord] = decisions.released
    yielded: Callable[[RunRecord, str, datetime], RunRecord] = decisions.yielded
    acquire: Callable[[LockRecord | None, LockRequest, datetime, RunRecord | None], LockGrant] = (
        locking.acquire
    )
    needs_holder: Callable[[LockRecord | None, str, datetime], bool] = locking.needs_holder
    next_token: Callable[[LockRecord | None, datetime], int] = locking.next_token
    lock_holds: Callable[[LockRecord | None, str], bool] = locking.holds
    lock_renewed: Callable[[LockRecord, timedelta, datetime], LockRecord] = locking.renewed
    lock_released: Callable[[LockRecord, datetime], LockRecord] = locking.released
    lock_released_by: Callable[[LockRecord | None, str], bool] = locking.released_by

    def failed(self, record: RunRecord, error: str, now: datetime) -> RunRecord:
        """A dead letter (the payload is not modelled)."""
        return decisions.failed(record, error, None, now)


@dataclass(frozen=True)
class Bounds:
    """What is explored. ``attempts`` are dealt to ``runs`` in turn (two runs share the
    lock: an exclusive job's, or a concurrency key's). Every instance's wall clock is ahead
    of true time by 0 or by ``skew``; true time runs from 0 to ``horizon``."""

    attempts: int = 3
    runs: int = 1
    lock: bool = False
    transactional: bool = False
    lease: timedelta = timedelta(seconds=3)
    skew: timedelta = c.MAX_CLOCK_SKEW
    retention: timedelta = timedelta(seconds=4)
    horizon: timedelta = timedelta(seconds=5)
    # A crash is an attempt that takes no step again: every state it leads to is reached by
    # that attempt stalling for good, still counted as holding until its lease runs out (a
    # stricter check). True explores the crash as a step of its own too.
    crashes: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.attempts <= 4:
            raise ValueError(
                f"attempts={self.attempts}: give 1 to 4 (each one more multiplies the states)"
            )
        if not 1 <= self.runs <= min(2, self.attempts):
            raise ValueError(f"runs={self.runs}: give 1, or 2 with at least 2 attempts")
        if self.runs > 1 and not self.lock:
            raise ValueError("runs=2 share nothing without the lock: give lock=True")
        if self.lease <= timedelta(0) or self.skew < timedelta(0):
            raise ValueError("the lease must be positive and the skew not negative")
        if self.horizon < self.lease or self.retention <= timedelta(0):
            raise ValueError("give a horizon of at least one lease and a positive retention")

    @property
    def tick(self) -> timedelta:
        """The clock's step: it divides the renewal interval (lease / 3), the skew, the
        retention and the horizon."""
        micros = [
            _micros(self.lease) // 3 if _micros(self.lease) % 3 == 0 else _micros(self.lease),
            _micros(self.lease),
            _micros(self.skew),
            _micros(self.retention),
            _micros(self.horizon),
        ]
        return timedelta(microseconds=math.gcd(*micros))

    def ticks(self, span: timedelta) -> int:
        """``span`` in ticks."""
        return _micros(span) // _micros(self.tick)

    def run_of(self, attempt: int) -> int:
        return attempt % self.runs

    def describe(self) -> str:
        what = "transactional" if self.transactional else "plain"
        lock = ", one lock" if self.lock else ""
        lock += ", crashes" if self.crashes else ""
        return (
            f"{self.attempts} attempts of {self.runs} run(s){lock}, {what} effect, "
            f"lease {_secs(self.lease)}, skew {_secs(self.skew)}, "
            f"retention {_secs(self.retention)}, horizon {_secs(self.horizon)}, "
            f"tick {_secs(self.tick)}"
        )


def _micros(span: timedelta) -> int:
    return (span.days * 86_400 + span.seconds) * 1_000_000 + span.microseconds


def _secs(span: timedelta) -> str:
    return f"{span.total_seconds():g}s"


# --- What happened: the facts the invariants read --------------------------------------


@dataclass(frozen=True)
class Effect:
    """The handler's effect, done by ``attempt`` of ``run`` at true time ``at``, with the
    run's fencing ``token`` and the ``lock_token`` it held; ``committed``: written in the
    transaction that completed the run (a transactional handler)."""

    attempt: str
    run: str
    at: int
    claimed: datetime  # The attempt's claim, by its own clock (the stamp the store wrote).
    token: int
    lock_token: int | None
    committed: bool


@dataclass(frozen=True)
class Completion:
    """A completion the store accepted, by ``attempt`` of ``run``, stamped ``at`` by its
    clock."""

    attempt: str
    run: str
    at: datetime


@dataclass(frozen=True)
class Holder:
    """An attempt that believes, at this instant, that it holds its run's lease (and
    ``lock`` when it holds the lock too)."""

    attempt: str
    run: str
    lock: bool


# --- The invariants: plain functions, each a message when broken, else None ------------


def holders_overlap(holders: Sequence[Holder]) -> str | None:
    """No two attempts of one run believe they hold its lease at one instant of true time,
    and no two attempts believe they hold the lock. (The skew allowance is in the rules:
    a takeover waits ``MAX_CLOCK_SKEW`` past the expiry, so clocks that differ by up to that
    leave no overlap at all.)"""
    for i, first in enumerate(holders):
        for second in holders[i + 1 :]:
            if first.run == second.run:
                return f"{first.attempt} and {second.attempt} both hold the lease of {first.run}"
            if first.lock and second.lock:
                return f"{first.attempt} and {second.attempt} both hold the lock"
    return None


def effect_while_another_holds(effect: Effect, holders: Sequence[Holder]) -> str | None:
    """An effect is repeated (at least once, not exactly once, for a handler whose effect
    does not commit with its completion) only after the earlier attempt's lease lapsed:
    never while another attempt of the run still holds it."""
    for holder in holders:
        if holder.run == effect.run and holder.attempt != effect.attempt:
            return f"{effect.attempt}'s effect while {holder.attempt} holds the lease"
    return None


def effect_repeated_after_completion(
    effect: Effect,
    completions: Sequence[Completion],
    retention: timedelta,
    skew: timedelta = c.MAX_CLOCK_SKEW,
) -> str | None:
    """Once a run's completion is recorded, no attempt claimed within the retention after
    it runs the effect again: a transactional effect (committed with the completion) is so
    committed once per run, and any other is not repeated after the run completed.

    Within less ``skew``, the most two clocks differ: an instance whose clock runs ahead
    finds the record past its retention (absent) that much sooner, and a run it starts
    afresh may then be retried from any instance."""
    for done in completions:
        if (
            done.run == effect.run
            and done.attempt != effect.attempt
            and effect.claimed + skew < done.at + retention
        ):
            return (
                f"{effect.attempt} ran the effect again, claimed {effect.claimed:%H:%M:%S}, "
                f"after {done.attempt} completed {effect.run} at {done.at:%H:%M:%S}"
            )
    return None


def completed_run_claimed_again(
    before: RunRecord | None, now: datetime, retention: timedelta
) -> str | None:
    """A claim granted at ``now`` over ``before``: never over a run completed less than the
    retention ago."""
    if (
        before is not None
        and before.status is RunStatus.COMPLETED
        and before.finished_at is not None
        and now < before.finished_at + retention
    ):
        return f"claimed at {now:%H:%M:%S}, completed at {before.finished_at:%H:%M:%S}"
    return None


def token_did_not_grow(token: int, highest_before: int | None) -> str | None:
    """Every grant (of the run, of the lock) carries a fencing token above every earlier
    grant's, so a downstream that keeps the highest token refuses only stale holders."""
    if highest_before is not None and token <= highest_before:
        return f"token {token} granted after token {highest_before}"
    return None


def finish_without_the_claim(
    before: RunRecord | None, attempt_id: str, accepted: bool
) -> str | None:
    """A finish (complete, fail, release, give back) is accepted only from the attempt that
    holds the claim: in progress, under its own attempt id. (A retried finish that finds its
    own write landed writes nothing, and is not a finish here.)"""
    holds = (
        before is not None
        and before.attempt_id == attempt_id
        and before.status is RunStatus.IN_PROGRESS
    )
    if accepted and not holds:
        held = "nothing" if before is None else f"{before.attempt_id} {before.status.value}"
        return f"{attempt_id}'s finish was accepted over {held}"
    return None


# --- The model's state ---------------------------------------------------------------


class Phase(Enum):
    """Where an attempt is in the executor's protocol."""

    WAITING = "waiting"  # Not delivered yet.
    LOCK = "lock"  # Claimed; takes the lock next.
    RUN = "run"  # The handler runs: its lease is renewed.
    RELEASE_LOCK = "release lock"  # The handler ended; the lock is released before the finish.
    FINISH = "finish"  # Writes its ending.
    GIVE_BACK = "give back"  # Gives the claim back (lock taken by another, or busy).
    DONE = "done"
    CRASHED = "crashed"


HOLDING = frozenset({Phase.LOCK, Phase.RUN, Phase.RELEASE_LOCK, Phase.FINISH, Phase.GIVE_BACK})


class DeliveryEnd(Enum):
    """How a delivery ends, written by its finish."""

    COMPLETE = "complete"
    FAIL = "fail"
    RELEASE = "release"
    YIELD = "yield"  # The claim given back unused: its lock was busy.
    NOTHING = "nothing"  # Written already (the transactional commit), or refused.


ASKED = -1  # A renewal sent, not landed yet.


@dataclass(frozen=True)
class AttemptState:
    """One attempt's local state. Times are true ticks; ``offset`` is how far its wall
    clock runs ahead. ``deadline``: when its confirmed lease runs out by its monotonic
    clock. ``renewal``: None, ASKED, or the deadline to confirm once the lock's renewal
    lands (the run's landed)."""

    phase: Phase = Phase.WAITING
    offset: int = 0
    deadline: int = 0
    lost: bool = False
    renewal: int | None = None
    has_lock: bool = False
    ending: DeliveryEnd = DeliveryEnd.NOTHING
    token: int = 0
    lock_token: int | None = None
    claimed: int = 0  # Its claim's time, true ticks.


@dataclass(frozen=True)
class State:
    """The whole system at one instant: true time, the store's records, every attempt, the
    completions accepted, the highest tokens granted and seen downstream. (The effects done
    are checked as they happen: nothing later reads them.)"""

    now: int
    records: tuple[RunRecord | None, ...]
    lock: LockRecord | None
    attempts: tuple[AttemptState, ...]
    completions: tuple[Completion, ...] = ()
    run_tokens: tuple[int | None, ...] = ()
    lock_token: int | None = None
    downstream: int = 0  # The highest fencing token the downstream accepted.

    def key(self) -> tuple[object, ...]:
        """The state as a hashable value (records hold a dict of identity fields)."""
        return (
            self.now,
            tuple(None if r is None else _record_key(r) for r in self.records),
            self.lock,
            self.attempts,
            self.completions,
            self.run_tokens,
            self.lock_token,
            self.downstream,
        )


def _record_key(record: RunRecord) -> tuple[object, ...]:
    """What of a run record the rules and the invariants read (attempt counts, error texts
    and claim times decide nothing here)."""
    return (
        record.status,
        record.attempt_id,
        record.fencing_token,
        record.lease_expires,
        record.expire_at,
        record.finished_at,
    )


# --- The report ----------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """An invariant broken, and a shortest trace of steps from the start that breaks it."""

    invariant: str
    message: str
    trace: tuple[str, ...]

    def __str__(self) -> str:
        steps = "\n".join(f"  {n}. {step}" for n, step in enumerate(self.trace, 1))
        return f"{self.invariant}: {self.message}\n{steps}"


@dataclass(frozen=True)
class ModelReport:
    """What :func:`explore` covered and found: distinct states, transitions taken, the
    deepest state (steps from the start), and one shortest violation per invariant."""

    bounds: Bounds
    states: int
    transitions: int
    max_depth: int
    violations: tuple[Violation, ...] = field(default=())

    def summary(self) -> str:
        return (
            f"{self.states} states, {self.transitions} transitions, depth {self.max_depth}, "
            f"{len(self.violations)} violations ({self.bounds.describe()})"
        )

    def __str__(self) -> str:
        return "\n".join([self.summary(), *(str(v) for v in self.violations)])


# --- The explorer --------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    label: str
    state: State
    broken: tuple[tuple[str, str], ...] = ()  # (invariant, message) this step broke.


def explore(
    bounds: Bounds | None = None, rules: Rules | None = None, *, stop_at_violation: bool = False
) -> ModelReport:
    """Every state reachable within ``bounds`` under ``rules``, breadth first; each
    invariant broken is reported once, with a shortest trace (its state is not expanded).
    ``stop_at_violation``: stop at the first one found (the counts then cover that far)."""
    model = _Model(bounds or Bounds(), rules or Rules())
    start = model.start()
    parents: dict[tuple[object, ...], tuple[tuple[object, ...] | None, str]] = {
        start.key(): (None, "start")
    }
    queue: deque[tuple[State, int]] = deque([(start, 0)])
    found: dict[str, Violation] = {}
    transitions = max_depth = 0

    def trace(key: tuple[object, ...]) -> tuple[str, ...]:
        steps: list[str] = []
        at: tuple[object, ...] | None = key
        while at is not None:
            at, label = parents[at]
            steps.append(label)
        return tuple(reversed(steps[:-1]))  # Without "start".

    while queue:
        state, depth = queue.popleft()
        max_depth = max(max_depth, depth)
        state_key = state.key()
        for step in model.steps(state):
            transitions += 1
            key = step.state.key()
            if key in parents:
                continue
            parents[key] = (state_key, step.label)
            broken = list(step.broken) + model.state_violations(step.state)
            for invariant, message in broken:
                if invariant not in found:
                    found[invariant] = Violation(invariant, message, trace(key))
            if not broken:
                queue.append((step.state, depth + 1))
            elif stop_at_violation:
                queue.clear()
                break
    return ModelReport(model.bounds, len(parents), transitions, max_depth, tuple(found.values()))


class _Model:
    """The protocol's steps, each applying the rules as a store does: atomically."""

    def __init__(self, bounds: Bounds, rules: Rules) -> None:
        self.bounds = bounds
        self.rules = rules
        self.tick = bounds.tick
        self.lease = bounds.ticks(bounds.lease)
        self.horizon = bounds.ticks(bounds.horizon)
        self.offsets = sorted({0, bounds.ticks(bounds.skew)})

    def start(self) -> State:
        bounds = self.bounds
        return State(
            now=0,
            records=(None,) * bounds.runs,
            lock=None,
            attempts=(AttemptState(),) * bounds.attempts,
            run_tokens=(None,) * bounds.runs,
        )

    # Names and clocks.

    def attempt_id(self, index: int) -> str:
        return f"a{index}"

    def run_id(self, index: int) -> str:
        return f"run{self.bounds.run_of(index)}"

    def run_index(self, run_id: str) -> int:
        return next(i for i in range(self.bounds.runs) if f"run{i}" == run_id)

    def stamp(self, state: State, attempt: AttemptState) -> datetime:
        """The attempt's wall clock now: what it hands the store."""
        return EPOCH + (state.now + attempt.offset) * self.tick

    def at(self, state: State, index: int, attempt: AttemptState) -> str:
        clock = f" (clock +{_secs(attempt.offset * self.tick)})" if attempt.offset else ""
        return f"t={_secs(state.now * self.tick)} {self.attempt_id(index)}{clock}"

    # What holds in a state.

    def holders(self, state: State) -> list[Holder]:
        return [
            Holder(self.attempt_id(i), self.run_id(i), a.has_lock)
            for i, a in enumerate(state.attempts)
            if a.phase in HOLDING and not a.lost and state.now < a.deadline
        ]

    def state_violations(self, state: State) -> list[tuple[str, str]]:
        message = holders_overlap(self.holders(state))
        return [] if message is None else [("holders overlap", message)]

    # The steps.

    def steps(self, state: State) -> Iterator[_Step]:
        if state.now < self.horizon and self.time_matters(state):
            yield _Step(
                f"t={_secs((state.now + 1) * self.tick)}: the clock ticks", self.ticked(state)
            )
        for index, attempt in enumerate(state.attempts):
            yield from self.attempt_steps(state, index, attempt)

    @staticmethod
    def time_matters(state: State) -> bool:
        """Time runs from the first delivery (the rules read differences of times only) until
        nothing is left to happen."""
        arrived = [a for a in state.attempts if a.phase is not Phase.WAITING]
        return bool(arrived) and any(
            a.phase is not Phase.DONE or a.renewal is not None for a in state.attempts
        )

    def ticked(self, state: State) -> State:
        return replace(state, now=state.now + 1)

    def attempt_steps(self, state: State, index: int, attempt: AttemptState) -> Iterator[_Step]:
        phase = attempt.phase
        if phase is Phase.WAITING:
            if self.arrives_in_order(state, index):
                for offset in self.offsets:
                    yield self.claim(state, index, replace(attempt, offset=offset))
            return
        if attempt.renewal is not None:
            yield self.renewal_lands(state, index, attempt)
        if phase in HOLDING and self.bounds.crashes:
            yield self.with_attempt(
                state,
                index,
                replace(attempt, phase=Phase.CRASHED),
                f"{self.at(state, index, attempt)} crashes",
            )
        if phase is Phase.LOCK:
            yield self.take_lock(state, index, attempt)
        elif phase is Phase.RUN:
            if attempt.renewal is None and not attempt.lost and self.renewal_due(state, attempt):
                yield self.ask_renewal(state, index, attempt)
            if self.bounds.transactional:
                yield self.commit(state, index, attempt)
            else:
                yield from self.effect(state, index, attempt)
        elif phase is Phase.RELEASE_LOCK:
            yield self.release_lock(state, index, attempt)
        elif phase in (Phase.FINISH, Phase.GIVE_BACK):
            yield self.finish(state, index, attempt)

    def arrives_in_order(self, state: State, index: int) -> bool:
        """Attempts of one run that have not arrived are alike: let them arrive in order
        (any other order is this one with the names swapped)."""
        run = self.bounds.run_of(index)
        return all(
            state.attempts[other].phase is not Phase.WAITING
            for other in range(index)
            if self.bounds.run_of(other) == run
        )

    def with_attempt(
        self, state: State, index: int, attempt: AttemptState, label: str, **changes: object
    ) -> _Step:
        attempts = list(state.attempts)
        attempts[index] = _settled(attempt)
        broken = changes.pop("broken", ())
        assert isinstance(broken, tuple)
        new = replace(state, attempts=tuple(attempts), **changes)  # type: ignore[arg-type]
        return _Step(label, new, broken)

    def with_record(
        self, state: State, index: int, record: RunRecord | None
    ) -> tuple[RunRecord | None, ...]:
        records = list(state.records)
        records[self.bounds.run_of(index)] = record
        return tuple(records)

    def claim(self, state: State, index: int, attempt: AttemptState) -> _Step:
        run = self.bounds.run_of(index)
        now = self.stamp(state, attempt)
        before = state.records[run]
        request = ClaimRequest(
            run_id=self.run_id(index),
            kind="task",
            handler="model",
            attempt_id=self.attempt_id(index),
            lease=self.bounds.lease,
            retention=self.bounds.retention,
        )
        outcome = self.rules.claim(before, request, now)
        label = f"{self.at(state, index, attempt)} is delivered and claims: {outcome.verdict.value}"
        if outcome.verdict is not Verdict.CLAIMED:
            return self.with_attempt(state, index, replace(attempt, phase=Phase.DONE), label)
        token = outcome.record.fencing_token
        broken = _named(
            (
                "completed run claimed again",
                completed_run_claimed_again(before, now, self.bounds.retention),
            ),
            ("fencing token did not grow", token_did_not_grow(token, state.run_tokens[run])),
        )
        tokens = list(state.run_tokens)
        tokens[run] = token
        claimed = replace(
            attempt,
            phase=Phase.LOCK if self.bounds.lock else Phase.RUN,
            deadline=state.now + self.lease,
            token=token,
            claimed=state.now,
        )
        return self.with_attempt(
            state,
            index,
            claimed,
            f"{label}, token {token}, lease to {outcome.record.lease_expires:%H:%M:%S}",
            records=self.with_record(state, index, outcome.record),
            run_tokens=tuple(tokens),
            broken=broken,
        )

    def take_lock(self, state: State, index: int, attempt: AttemptState) -> _Step:
        now = self.stamp(state, attempt)
        request = LockRequest(
            name=LOCK_NAME,
            run_id=self.run_id(index),
            attempt_id=self.attempt_id(index),
            lease=self.bounds.lease,
        )
        lock = state.lock
        holder = None
        if lock is not None and self.rules.needs_holder(lock, request.run_id, now):
            holder = state.records[self.run_index(lock.holder_run_id)]
        grant = self.rules.acquire(lock, request, now, holder)
        label = f"{self.at(state, index, attempt)} takes the lock"
        if not grant.acquired:
            yielded = replace(attempt, phase=Phase.GIVE_BACK, ending=DeliveryEnd.YIELD)
            return self.with_attempt(state, index, yielded, f"{label}: busy, gives the claim back")
        written = grant.lock
        broken: tuple[tuple[str, str], ...] = ()
        lock_token = state.lock_token
        if written is not lock:
            written = written.replace(fencing_token=self.rules.next_token(lock, now))
            broken = _named(
                (
                    "fencing token did not grow",
                    token_did_not_grow(written.fencing_token, lock_token),
                )
            )
            lock_token = written.fencing_token
        holding = replace(attempt, phase=Phase.RUN, has_lock=True, lock_token=written.fencing_token)
        return self.with_attempt(
            state,
            index,
            holding,
            f"{label}: token {written.fencing_token}",
            lock=written,
            lock_token=lock_token,
            broken=broken,
        )

    def renewal_due(self, state: State, attempt: AttemptState) -> bool:
        """The lease keeper renews a third of a lease after the last confirmation, or later."""
        return state.now >= attempt.deadline - self.lease + max(self.lease // 3, 1)

    def ask_renewal(self, state: State, index: int, attempt: AttemptState) -> _Step:
        label = f"{self.at(state, index, attempt)} renews its lease"
        if state.now >= attempt.deadline:  # The keeper reads lease_lost first.
            return self.with_attempt(
                state, index, replace(attempt, lost=True), f"{label}: lost (lease ran out)"
            )
        return self.with_attempt(state, index, replace(attempt, renewal=ASKED), f"{label}: sent")

    def renewal_lands(self, state: State, index: int, attempt: AttemptState) -> _Step:
        """The renewal lands at the store now, however late: the run's, then the lock's."""
        now = self.stamp(state, attempt)
        attempt_id = self.attempt_id(index)
        run = self.bounds.run_of(index)
        label = f"{self.at(state, index, attempt)}'s renewal lands"
        confirmed = state.now + self.lease  # local_deadline: from the store's time + lease.
        if attempt.renewal == ASKED:
            record = state.records[run]
            if record is None or not self.rules.renewable(record, attempt_id):
                lost = replace(attempt, renewal=None, lost=True)
                return self.with_attempt(state, index, lost, f"{label}: refused")
            written = self.rules.renewed(record, now + self.bounds.lease, self.bounds.retention)
            records = self.with_record(state, index, written)
            if attempt.has_lock:
                pending = replace(attempt, renewal=confirmed)
                return self.with_attempt(
                    state, index, pending, f"{label}: run renewed, lock next", records=records
                )
            return self.with_attempt(
                state, index, self.confirm(attempt, confirmed), f"{label}: renewed", records=records
            )
        lock = state.lock
        assert attempt.renewal is not None
        if lock is None or not self.rules.lock_holds(lock, attempt_id):
            lost = replace(attempt, renewal=None, lost=True)
            return self.with_attempt(state, index, lost, f"{label}: lock refused")
        written_lock = self.rules.lock_renewed(lock, self.bounds.lease, now)
        return self.with_attempt(
            state,
            index,
            self.confirm(attempt, attempt.renewal),
            f"{label}: lock renewed",
            lock=written_lock,
        )

    @staticmethod
    def confirm(attempt: AttemptState, deadline: int) -> AttemptState:
        return replace(attempt, renewal=None, deadline=deadline)

    def effect(self, state: State, index: int, attempt: AttemptState) -> Iterator[_Step]:
        """The handler checks its lease (``ctx.check_lease()``), then does its effect with
        its fencing token, and returns, raises, or raises PermanentFailure."""
        label = f"{self.at(state, index, attempt)} runs the effect"
        if attempt.lost or state.now >= attempt.deadline:
            lost = replace(attempt, lost=True, phase=Phase.RELEASE_LOCK, ending=DeliveryEnd.RELEASE)
            yield self.with_attempt(state, index, lost, f"{label}: LeaseLost, releases")
            return
        done = self.effect_done(state, index, attempt, committed=False)
        for ending in (DeliveryEnd.COMPLETE, DeliveryEnd.RELEASE, DeliveryEnd.FAIL):
            ended = replace(attempt, phase=Phase.RELEASE_LOCK, ending=ending)
            yield self.with_attempt(state, index, ended, f"{label}, then {ending.value}s", **done)

    def effect_done(
        self, state: State, index: int, attempt: AttemptState, *, committed: bool
    ) -> dict[str, object]:
        effect = Effect(
            attempt=self.attempt_id(index),
            run=self.run_id(index),
            at=state.now,
            claimed=EPOCH + (attempt.claimed + attempt.offset) * self.tick,
            token=attempt.token,
            lock_token=attempt.lock_token,
            committed=committed,
        )
        fencing = attempt.lock_token if attempt.lock_token is not None else attempt.token
        holders = [h for h in self.holders(state) if h.attempt != effect.attempt]
        broken = _named(
            ("effect while another holds", effect_while_another_holds(effect, holders)),
            (
                "effect repeated after completion",
                effect_repeated_after_completion(
                    effect, state.completions, self.bounds.retention, self.bounds.skew
                ),
            ),
        )
        return {
            "downstream": max(state.downstream, fencing),
            "broken": broken,
        }

    def commit(self, state: State, index: int, attempt: AttemptState) -> _Step:
        """A transactional handler: its effect and the completion commit together, only if
        the attempt still holds the claim."""
        now = self.stamp(state, attempt)
        attempt_id = self.attempt_id(index)
        before = state.records[self.bounds.run_of(index)]
        label = f"{self.at(state, index, attempt)} commits the effect with the completion"
        after = replace(attempt, phase=Phase.RELEASE_LOCK, ending=DeliveryEnd.NOTHING)
        if self.rules.finished_by(before, attempt_id, RunStatus.COMPLETED):
            return self.with_attempt(state, index, after, f"{label}: committed before")
        if before is None or not self.rules.holds(before, attempt_id):
            return self.with_attempt(state, index, after, f"{label}: refused, rolled back")
        written = self.rules.kept(
            self.rules.completed(before, None, now), now, self.bounds.retention
        )
        done = self.effect_done(state, index, attempt, committed=True)
        broken = done.pop("broken")
        assert isinstance(broken, tuple)
        broken += _named(
            ("finish without the claim", finish_without_the_claim(before, attempt_id, True))
        )
        return self.with_attempt(
            state,
            index,
            after,
            label,
            records=self.with_record(state, index, written),
            completions=(*state.completions, Completion(attempt_id, self.run_id(index), now)),
            broken=broken,
            **done,
        )

    def release_lock(self, state: State, index: int, attempt: AttemptState) -> _Step:
        """Before the finish the lock is released, fenced; refused: the lock was taken over,
        and the claim is given back instead of the ending written."""
        if not attempt.has_lock:
            return self.with_attempt(
                state,
                index,
                replace(attempt, phase=self.after_lock(attempt)),
                f"{self.at(state, index, attempt)} finishes",
            )
        now = self.stamp(state, attempt)
        attempt_id = self.attempt_id(index)
        lock = state.lock
        label = f"{self.at(state, index, attempt)} releases the lock"
        released = replace(attempt, has_lock=False, phase=self.after_lock(attempt))
        if self.rules.lock_released_by(lock, attempt_id):
            return self.with_attempt(state, index, released, f"{label}: released before")
        if lock is None or not self.rules.lock_holds(lock, attempt_id):
            refused = replace(
                attempt, has_lock=False, phase=Phase.GIVE_BACK, ending=DeliveryEnd.RELEASE
            )
            if attempt.ending is DeliveryEnd.NOTHING:
                refused = replace(refused, phase=Phase.DONE)
            return self.with_attempt(state, index, refused, f"{label}: refused (taken over)")
        return self.with_attempt(
            state, index, released, label, lock=self.rules.lock_released(lock, now)
        )

    @staticmethod
    def after_lock(attempt: AttemptState) -> Phase:
        return Phase.DONE if attempt.ending is DeliveryEnd.NOTHING else Phase.FINISH

    def finish(self, state: State, index: int, attempt: AttemptState) -> _Step:
        """The ending written only if the attempt holds the claim; a retry of a finish whose
        write landed unseen is recognised by its attempt id (the store's ``_if_held``)."""
        now = self.stamp(state, attempt)
        attempt_id = self.attempt_id(index)
        before = state.records[self.bounds.run_of(index)]
        ending = attempt.ending
        status = {
            DeliveryEnd.COMPLETE: RunStatus.COMPLETED,
            DeliveryEnd.FAIL: RunStatus.FAILED,
            DeliveryEnd.RELEASE: RunStatus.RELEASED,
        }.get(ending)
        label = f"{self.at(state, index, attempt)} writes {ending.value}"
        done = replace(attempt, phase=Phase.DONE)
        if self.rules.finished_by(before, attempt_id, status):
            return self.with_attempt(state, index, done, f"{label}: written before")
        if before is None or not self.rules.holds(before, attempt_id):
            return self.with_attempt(state, index, done, f"{label}: refused (taken over)")
        rules = self.rules
        if ending is DeliveryEnd.COMPLETE:
            written = rules.completed(before, None, now)
        elif ending is DeliveryEnd.FAIL:
            written = rules.failed(before, "permanent failure", now)
        elif ending is DeliveryEnd.YIELD:
            written = rules.yielded(before, "lock busy", now)
        else:
            written = rules.released(before, "retry", now)
        if ending is not DeliveryEnd.YIELD:  # yield_claim keeps the record's retention as it is.
            written = rules.kept(written, now, self.bounds.retention)
        completions = state.completions
        if ending is DeliveryEnd.COMPLETE:
            completions = (*completions, Completion(attempt_id, self.run_id(index), now))
        return self.with_attempt(
            state,
            index,
            done,
            label,
            records=self.with_record(state, index, written),
            completions=completions,
            broken=_named(
                ("finish without the claim", finish_without_the_claim(before, attempt_id, True))
            ),
        )


def _settled(attempt: AttemptState) -> AttemptState:
    """An attempt that takes no more steps keeps only what a renewal it sent needs when it
    lands (states that differ in the rest behave alike)."""
    if attempt.phase not in (Phase.DONE, Phase.CRASHED):
        return attempt
    if attempt.renewal is None:
        return AttemptState(phase=Phase.DONE)
    return AttemptState(
        phase=Phase.DONE, offset=attempt.offset, renewal=attempt.renewal, has_lock=attempt.has_lock
    )


def _named(*checks: tuple[str, str | None]) -> tuple[tuple[str, str], ...]:
    return tuple((name, message) for name, message in checks if message is not None)


def main(argv: Sequence[str] | None = None) -> int:
    """Explore the bounds given (the defaults unless told) and print one summary line; the
    violations' traces follow it. Exit status 1 if any invariant is broken."""
    parser = argparse.ArgumentParser(prog="python -m tasklease.testing.model")
    parser.add_argument("--attempts", type=int, default=Bounds.attempts)
    parser.add_argument("--runs", type=int, default=Bounds.runs)
    parser.add_argument("--lock", action="store_true", help="the attempts take one lock")
    parser.add_argument("--transactional", action="store_true")
    args = parser.parse_args(argv)
    try:
        bounds = Bounds(
            attempts=args.attempts,
            runs=args.runs,
            lock=args.lock,
            transactional=args.transactional,
        )
    except ValueError as exc:
        parser.error(str(exc))
    report = explore(bounds)
    print(report)
    return 1 if report.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
