"""The command line that replays a simulation exactly, and how its lists are written: fault
and workload kinds (``kill,stall``; ``none``), a script of fault occurrences
(``kill:0,stall:3``; ``none``) and fault probabilities (``stall=0.05,duplicate=0.2``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tasklease.testing.simulation.faults import FAULT_KINDS, RATED_KINDS, FaultPlan, Occurrence
from tasklease.testing.simulation.workload import WORKLOAD_KINDS

__all__ = [
    "NONE",
    "kinds_text",
    "parse_kinds",
    "parse_rates",
    "parse_script",
    "rates_text",
    "replay_command",
    "script_text",
]

NONE = "none"  # An empty list on the command line.


def replay_command(
    store: str, seed: int, lifecycles: int, plan: FaultPlan, workload: Iterable[str]
) -> str:
    """``tasklease simulate ...`` with every flag that makes this run what it was."""
    command = f"tasklease simulate --store {store} --seed {seed} --lifecycles {lifecycles}"
    if plan.kinds != frozenset(FAULT_KINDS):
        command += f" --faults {kinds_text(plan.kinds)}"
    if plan.rates:
        command += f" --rates {rates_text(plan.rates)}"
    kinds = frozenset(workload)
    if kinds != frozenset(WORKLOAD_KINDS):
        command += f" --workload {kinds_text(kinds)}"
    if plan.script is not None:
        command += f" --keep-faults {script_text(plan.script)}"
    return command


def kinds_text(kinds: Iterable[str]) -> str:
    return ",".join(sorted(kinds)) or NONE


def parse_kinds(text: str) -> list[str]:
    """``kill,stall`` as its kinds; ``none`` (or nothing) as none. Unknown names are the
    caller's to refuse (FaultPlan.only, Workload.only name the known ones)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    return [] if names == [NONE] else names


def script_text(script: Iterable[Occurrence]) -> str:
    return ",".join(f"{kind}:{number}" for kind, number in sorted(script)) or NONE


def parse_script(text: str) -> frozenset[Occurrence]:
    """``kill:0,stall:3`` as its occurrences; ``none`` as none. ValueError names a bad one."""
    script: set[Occurrence] = set()
    for item in parse_kinds(text):
        kind, _, number = item.partition(":")
        if kind not in FAULT_KINDS or not number.isdigit():
            raise ValueError(
                f"bad fault occurrence {item!r}: write KIND:N (N counts from 0 the draws of "
                f"KIND that said fire), KIND one of {', '.join(FAULT_KINDS)}; or {NONE}"
            )
        script.add((kind, int(number)))
    return frozenset(script)


def rates_text(rates: Mapping[str, float]) -> str:
    return ",".join(f"{kind}={rate!r}" for kind, rate in sorted(rates.items()))


def parse_rates(text: str) -> dict[str, float]:
    """``stall=0.05,duplicate=0.2`` as probabilities by kind; ValueError names a bad item
    (FaultPlan.with_rates refuses an unknown kind or a probability outside [0, 1])."""
    rates: dict[str, float] = {}
    for item in parse_kinds(text):
        kind, _, number = item.partition("=")
        try:
            rates[kind.strip()] = float(number)
        except ValueError:
            raise ValueError(
                f"bad fault probability {item!r}: write KIND=P, P a number in [0, 1], KIND one "
                f"of {', '.join(RATED_KINDS)}"
            ) from None
    return rates
