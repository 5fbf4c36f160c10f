"""The faults a simulation injects, each drawn from the seed: what can go wrong between Cloud
Tasks, a worker instance and its store, and how often.

:class:`StoreFaults` puts the engine between the executor and a real store: each public call of
the store pauses the calling actor (so another may run between any two store calls), and may
fail, time out, or commit with its answer lost, as a store across a network does, or reach
the store only after the caller's lease ran out: the request a renewal or a finish sent while
its lease held, held up on its way (a congested link, retransmits, a store's own queue), which
only the store's check of the attempt id stops from landing on a successor's claim.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tasklease.errors import StoreUnavailable
from tasklease.testing.simulation.engine import Engine
from tasklease.worker.core.constants import MAX_CLOCK_SKEW
from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["FAULT_KINDS", "RATED_KINDS", "FaultPlan", "Occurrence", "StoreFaults", "Trace"]

# Every fault kind the simulation knows; by default all are on.
FAULT_KINDS = (
    "kill",  # An instance dies at any pause of an attempt: all it would still do is lost.
    "stall",  # An instance pauses (a frozen VM) long enough for its lease to run out.
    "clock_skew",  # Each instance's wall clock is off by up to MAX_CLOCK_SKEW from the others'.
    "store_error",  # A store call fails before it reaches the store.
    "store_timeout",  # A store call hangs, then fails, without reaching the store.
    "lost_answer",  # A store call commits, and its answer never reaches the caller.
    "slow_request",  # A store call's request is held up on its way, past the caller's lease.
    "store_outage",  # The store answers no call for a window of time.
    "duplicate",  # Cloud Tasks delivers an attempt twice.
    "lost_response",  # The worker's answer never reaches the queue: it retries the task.
    "dispatch_deadline",  # An attempt outlives the queue's dispatch deadline: retried meanwhile.
)

# The kinds drawn with a probability of their own (a plan's field of the same name); clock
# skew is no draw but a bound.
RATED_KINDS = tuple(kind for kind in FAULT_KINDS if kind != "clock_skew")

# One fault that fired: its kind, and how many draws of that kind had said "fire" before it
# (counting from 0), whether those fired or not. A script of them replays a run's faults.
Occurrence = tuple[str, int]

# Store methods that are not calls an executor makes over the network.
_NOT_CALLS = frozenset({"close", "prepare", "purge", "check_configuration"})


@dataclass(frozen=True)
class FaultPlan:
    """How likely each fault is, per opportunity. ``kinds`` limits them (default: all);
    ``script``, when set, lets only the occurrences it names fire (a replay of some of a
    run's faults: :mod:`~tasklease.testing.simulation.shrink`). ``dispatch_deadline`` is
    no draw but what a slow attempt meets, so no script holds it back."""

    kinds: frozenset[str] = frozenset(FAULT_KINDS)
    kill: float = 0.004  # Per pause of an attempt.
    stall: float = 0.003  # Per pause of an attempt.
    store_error: float = 0.01  # Per store call.
    store_timeout: float = 0.004
    lost_answer: float = 0.01
    # Per store call. Drawn from a stream of its own: a run in which none fires is the run
    # without the kind, draw for draw.
    slow_request: float = 0.002
    store_outage: float = 0.001  # Per store call: an outage starts.
    duplicate: float = 0.03  # Per dispatch.
    lost_response: float = 0.03  # Per answer.
    dispatch_deadline: float = 0.03  # Per dispatch: a deadline shorter than the work.
    # How far apart instances' clocks may be: the bound the protocol allows for by default;
    # a test sets more to show what breaks beyond it.
    max_clock_skew: timedelta = MAX_CLOCK_SKEW
    script: frozenset[Occurrence] | None = None

    @classmethod
    def only(cls, kinds: Iterable[str]) -> FaultPlan:
        """A plan with just ``kinds`` on (ValueError naming any unknown one)."""
        chosen = frozenset(kinds)
        unknown = sorted(chosen - set(FAULT_KINDS))
        if unknown:
            raise ValueError(
                f"unknown fault kind(s) {', '.join(unknown)}: choose from {', '.join(FAULT_KINDS)}"
            )
        return cls(kinds=chosen)

    def on(self, kind: str) -> bool:
        return kind in self.kinds

    def with_rates(self, rates: Mapping[str, float]) -> FaultPlan:
        """This plan with the probabilities ``rates`` names (``{"stall": 0.05}``): a run that
        concentrates its faults on one threat. ValueError names an unknown kind or a
        probability outside [0, 1]."""
        unknown = sorted(set(rates) - set(RATED_KINDS))
        if unknown:
            raise ValueError(
                f"no probability to set for {', '.join(unknown)}: choose from "
                f"{', '.join(RATED_KINDS)}"
            )
        for kind, rate in rates.items():
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"the probability of {kind} must lie in [0, 1], not {rate}")
        changes: dict[str, Any] = dict(rates)
        return dataclasses.replace(self, **changes)

    @property
    def rates(self) -> dict[str, float]:
        """The probabilities this plan sets apart from the defaults, by kind."""
        default = FaultPlan()
        return {
            kind: getattr(self, kind)
            for kind in RATED_KINDS
            if getattr(self, kind) != getattr(default, kind)
        }


class Trace:
    """The simulation's event trace, hashed as it grows, and the faults injected so far."""

    def __init__(
        self, engine: Engine, keep: bool = False, script: frozenset[Occurrence] | None = None
    ) -> None:
        import hashlib  # noqa: PLC0415 - only here.

        self.engine = engine
        self.script = script
        self.drawn: Counter[str] = Counter()  # Draws that said "fire", per kind.
        self.fired: list[Occurrence] = []
        self.faults: Counter[str] = Counter()
        self.events = 0
        self.kept: list[str] | None = [] if keep else None
        self._hash = hashlib.sha256()

    def note(self, text: str) -> None:
        """Add one event, stamped with the virtual time and the running actor."""
        actor = self.engine.current_actor()
        line = f"{self.engine.now:.6f} {actor.name if actor else '-'} {text}"
        self._hash.update(line.encode() + b"\n")
        self.events += 1
        if self.kept is not None:
            self.kept.append(line)

    def fires(self, kind: str) -> bool:
        """Whether a fault whose draw said "fire" does: every one, unless the script names
        the occurrences that may. Called once per such draw, so each gets its number."""
        occurrence = (kind, self.drawn[kind])
        self.drawn[kind] += 1
        if self.script is not None and occurrence not in self.script:
            return False
        self.fired.append(occurrence)
        return True

    def fault(self, kind: str, detail: str = "") -> None:
        self.faults[kind] += 1
        self.note(f"FAULT {kind} {detail}".rstrip())

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()


class StoreFaults:
    """Wraps every public call of one store instance in a pause and the store faults of
    ``plan`` (the store object stays itself, so isinstance checks and collaborators hold).
    A ``slow_request`` holds a request up for a time drawn from ``slow_for`` (seconds), with
    ``slow_rng``."""

    def __init__(
        self,
        engine: Engine,
        store: LeaseStore,
        plan: FaultPlan,
        rng: random.Random,
        trace: Trace,
        *,
        slow_rng: random.Random,
        slow_for: tuple[float, float],
    ) -> None:
        self.engine = engine
        self.store = store
        self.plan = plan
        self.rng = rng
        self.trace = trace
        self.slow_rng = slow_rng
        self.slow_for = slow_for
        self.outage_until = -1.0
        self.calls = 0
        for name in _call_names(store):
            original = getattr(store, name)
            setattr(store, name, self._wrapped(name, original))

    def _wrapped(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def faulty(*args: Any, **kwargs: Any) -> Any:
            actor = self.engine.current_actor()
            if actor is None or actor.in_store:
                return call(*args, **kwargs)  # Set-up, or a store calling itself.
            return self._call(actor, name, call, args, kwargs)

        return faulty

    def _call(self, actor: Any, name: str, call: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        plan, rng, trace = self.plan, self.rng, self.trace
        self.calls += 1
        on_its_way = rng.uniform(0.0005, 0.02)
        if (
            plan.on("slow_request")
            and self.slow_rng.random() < plan.slow_request
            and trace.fires("slow_request")
        ):
            held_up = self.slow_rng.uniform(*self.slow_for)
            trace.fault("slow_request", f"{name} {held_up:.3f}s")
            on_its_way += held_up
        actor.pause(on_its_way)  # The request on its way.
        now = self.engine.now
        if (
            plan.on("store_outage")
            and now >= self.outage_until
            and rng.random() < plan.store_outage
            and trace.fires("store_outage")
        ):
            self.outage_until = now + rng.uniform(1.0, 60.0)
            trace.fault("store_outage", f"until {self.outage_until:.3f}")
        if now < self.outage_until:
            trace.note(f"store {name} refused: outage")
            raise StoreUnavailable(f"simulated outage of the store ({name})")
        if (
            plan.on("store_error")
            and rng.random() < plan.store_error
            and trace.fires("store_error")
        ):
            trace.fault("store_error", name)
            raise StoreUnavailable(f"simulated store error ({name})")
        if (
            plan.on("store_timeout")
            and rng.random() < plan.store_timeout
            and trace.fires("store_timeout")
        ):
            trace.fault("store_timeout", name)
            actor.pause(rng.uniform(1.0, 10.0))
            raise StoreUnavailable(f"simulated store timeout ({name})")
        lose = plan.on("lost_answer") and rng.random() < plan.lost_answer
        actor.in_store += 1
        try:
            result = call(*args, **kwargs)
        finally:
            actor.in_store -= 1
        trace.note(f"store {name} -> {_summary(result)}")
        if lose and trace.fires("lost_answer"):
            trace.fault("lost_answer", name)
            actor.pause(rng.uniform(0.5, 5.0))
            raise StoreUnavailable(f"simulated: the answer of {name} was lost")
        actor.pause(rng.uniform(0.0005, 0.02))  # The answer on its way back.
        return result


def _call_names(store: LeaseStore) -> list[str]:
    names = []
    for name in sorted(dir(type(store))):
        if name.startswith("_") or name in _NOT_CALLS:
            continue
        if inspect.isfunction(inspect.getattr_static(type(store), name)):
            names.append(name)
    return names


def _summary(result: Any) -> str:
    """A store answer as the trace keeps it: its kind and verdict, never a store's own ids
    or timestamps in a form another store would write differently."""
    verdict = getattr(result, "verdict", None)
    if verdict is not None:
        return str(getattr(verdict, "value", verdict))
    if result is None or isinstance(result, bool | int | str):
        return repr(result)
    return type(result).__name__
