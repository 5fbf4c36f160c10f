"""Replaying a failing simulation exactly, and shrinking it to a minimal one that still fails.

A run is fixed by its :class:`Configuration`: the store, the seed, the number of lifecycles,
the fault kinds and workload kinds on, and optionally a *script* of faults. Every choice is
drawn from the seed, so the same configuration gives the same run, trace hash included, in
any process: :attr:`Configuration.replay` is the ``tasklease simulate`` command line for it.

**Faults as a script.** Each fault a run injects is a draw of the seed's fault stream that
said "fire". Numbering those draws per kind names each fault: ``(kind, n)``, the ``n``-th
draw of ``kind`` that said fire (:data:`~tasklease.testing.simulation.faults.Occurrence`). A
script (``FaultPlan.script``, ``--keep-faults kill:0,stall:3``) lets only the occurrences it
names fire; every draw is still made, so the streams stay the seed's. A run's own faults
(``SimulationReport.fired``) as its script replay it unchanged.

**Shrinking** (:func:`shrink`) keeps each change only while the *same* invariant still
fails, in this order:

1. Lifecycles, by bisection. Arrivals are drawn apart from what runs, so a run of fewer
   lifecycles is the same run up to the first lifecycle it leaves out: a violation that
   happened before that lifecycle arrived happens again.
2. Fault kinds, then workload kinds, by delta debugging (ddmin). Turning a kind off takes
   its draws out of the streams: a different run, which is why this comes before the
   script, whose numbers it would change.
3. The faults themselves: the run's fired occurrences become its script, and ddmin removes
   them, in chunks of neighbours in time first, then one by one. Removing a fault changes
   what follows it (an instance not stalled makes other calls), so a later number may name
   another moment: each candidate is judged by running it, never assumed.
4. Fault kinds again, now under the script: a kind none of the kept faults is of may go.
5. Lifecycles again, under the script (the prefix property still holds).

Finally the script is cut to the faults that fired in the last run, which leaves that run
as it was (an occurrence named but never drawn changes nothing): its length is the number
of faults the minimal run needs. ddmin (Zeller and Hildebrandt, "Simplifying and isolating
failure-inducing input", 2002) leaves a set from which no single fault can be removed
without the invariant passing, in O(n log n) runs typically.

Why not hypothesis' shrinker: it minimises its own sequence of choices, so a shrunk run
would replay only as a hypothesis example, not as a seed and a command line anyone can
paste; named faults keep every step of the search a ``tasklease simulate`` command.

``max_runs`` bounds the search; what :func:`shrink` returns always fails the invariant,
and ``Shrunk.complete`` says whether every step ran to its end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tasklease.testing.simulation.faults import FAULT_KINDS, FaultPlan, Occurrence
from tasklease.testing.simulation.replay import kinds_text, replay_command, script_text
from tasklease.testing.simulation.run import SimulationReport, simulate
from tasklease.testing.simulation.workload import WORKLOAD_KINDS, Workload
from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["Configuration", "Shrunk", "shrink"]

T = TypeVar("T")
DEFAULT_MAX_RUNS = 400


@dataclass(frozen=True)
class Configuration:
    """Everything that fixes one simulation run (``rates``: the fault probabilities set apart
    from the defaults, by kind)."""

    store: str
    seed: int
    lifecycles: int
    faults: frozenset[str] = frozenset(FAULT_KINDS)
    workload: frozenset[str] = frozenset(WORKLOAD_KINDS)
    script: frozenset[Occurrence] | None = None  # None: every fault drawn fires.
    rates: tuple[tuple[str, float], ...] = ()

    @property
    def plan(self) -> FaultPlan:
        plan = FaultPlan.only(self.faults).with_rates(dict(self.rates))
        return dataclasses.replace(plan, script=self.script)

    @property
    def replay(self) -> str:
        """The command line that runs exactly this."""
        return replay_command(self.store, self.seed, self.lifecycles, self.plan, self.workload)

    def run(
        self, store_factory: Callable[[], LeaseStore], *, keep_trace: bool = False
    ) -> SimulationReport:
        return simulate(
            store_factory,
            seed=self.seed,
            lifecycles=self.lifecycles,
            faults=self.plan,
            workload=Workload.only(self.workload),
            store_name=self.store,
            keep_trace=keep_trace,
        )


@dataclass(frozen=True)
class Shrunk:
    """A failing run and the smallest found that fails the same invariant."""

    invariant: str
    original: Configuration
    original_report: SimulationReport
    configuration: Configuration  # The minimal one; its script names every fault it keeps.
    report: SimulationReport  # Its run.
    runs: int  # Simulations the search ran.
    complete: bool  # False: max_runs ended the search before every step finished.

    @property
    def replay(self) -> str:
        return self.configuration.replay

    def summary(self) -> str:
        """One line: what was shrunk to what, and how to replay it."""
        before, after = self.original_report, self.report
        return (
            f"shrunk {self.invariant}: {before.lifecycles} -> {after.lifecycles} lifecycles, "
            f"{sum(before.faults.values())} -> {sum(after.faults.values())} faults "
            f"({len(after.fired)} kept by the script), in {self.runs} runs"
            f"{'' if self.complete else ' (stopped at the run budget)'}; "
            f"replay: {self.replay}"
        )


class _OutOfRuns(Exception):
    """The run budget is spent: the search stops where it is."""


class _Search:
    """Runs configurations, remembering each verdict and the last failing run."""

    def __init__(
        self,
        store_factory: Callable[[], LeaseStore],
        invariant: str,
        max_runs: int,
        progress: Callable[[str], None],
    ) -> None:
        self.store_factory, self.invariant = store_factory, invariant
        self.max_runs, self.progress = max_runs, progress
        self.runs = 0
        self.verdicts: dict[Configuration, bool] = {}
        self.reports: dict[Configuration, SimulationReport] = {}

    def fails(self, configuration: Configuration) -> bool:
        """Whether ``configuration`` still breaks the invariant."""
        if configuration in self.verdicts:
            return self.verdicts[configuration]
        if self.runs >= self.max_runs:
            raise _OutOfRuns
        self.runs += 1
        try:
            report = configuration.run(self.store_factory)
        except ValueError:  # Asks for no workload kind this store runs.
            verdict = False
        else:
            verdict = any(v.invariant == self.invariant for v in report.found)
            if verdict:
                self.reports[configuration] = report
        self.verdicts[configuration] = verdict
        return verdict

    def fewer_lifecycles(self, configuration: Configuration) -> Configuration:
        """The fewest lifecycles that still fail, by bisection (a failing count is kept)."""
        passes, fails = 0, configuration.lifecycles
        while fails - passes > 1:
            middle = (passes + fails) // 2
            if self.fails(dataclasses.replace(configuration, lifecycles=middle)):
                fails = middle
            else:
                passes = middle
        if fails != configuration.lifecycles:
            self.progress(f"lifecycles {configuration.lifecycles} -> {fails}")
        return dataclasses.replace(configuration, lifecycles=fails)

    def fewer_fault_kinds(self, configuration: Configuration) -> Configuration:
        def configured(kinds: frozenset[str]) -> Configuration:
            return dataclasses.replace(configuration, faults=kinds)

        return configured(self._fewer("fault", configuration.faults, configured))

    def fewer_workload_kinds(self, configuration: Configuration) -> Configuration:
        def configured(kinds: frozenset[str]) -> Configuration:
            return dataclasses.replace(configuration, workload=kinds)

        return configured(self._fewer("workload", configuration.workload, configured))

    def _fewer(
        self,
        what: str,
        kinds: frozenset[str],
        configured: Callable[[frozenset[str]], Configuration],
    ) -> frozenset[str]:
        kept = ddmin(sorted(kinds), lambda subset: self.fails(configured(frozenset(subset))))
        if len(kept) != len(kinds):
            self.progress(f"{what} kinds {len(kinds)} -> {len(kept)}: {kinds_text(kept)}")
        return frozenset(kept)

    def fewer_faults(self, configuration: Configuration) -> Configuration:
        fired = self.reports[configuration].fired  # A failing one: its run is kept.
        kept = ddmin(
            list(fired),  # In the order they fired: neighbours in time go together.
            lambda subset: self.fails(dataclasses.replace(configuration, script=frozenset(subset))),
        )
        if len(kept) != len(fired):
            self.progress(f"faults {len(fired)} -> {len(kept)}: {script_text(kept)}")
        return dataclasses.replace(configuration, script=frozenset(kept))


def shrink(
    store_factory: Callable[[], LeaseStore],
    start: Configuration,
    *,
    report: SimulationReport | None = None,
    invariant: str | None = None,
    max_runs: int = DEFAULT_MAX_RUNS,
    progress: Callable[[str], None] = lambda line: None,
) -> Shrunk:
    """The smallest configuration found from ``start`` that still breaks ``invariant``
    (default: that of the earliest violation of ``start``'s run; ``report``, when given, is
    that run's, not run again). ValueError when ``start`` breaks nothing, or not
    ``invariant``."""
    original_report = report or start.run(store_factory)
    if not original_report.found:
        raise ValueError(f"{start.replay} finds no violation: nothing to shrink")
    target = invariant or min(original_report.found, key=lambda v: v.at).invariant
    if all(v.invariant != target for v in original_report.found):
        raise ValueError(f"{start.replay} does not break {target}: nothing to shrink")
    search = _Search(store_factory, target, max_runs, progress)
    search.verdicts[start] = True
    search.reports[start] = original_report
    best, complete = start, True
    try:
        best = search.fewer_lifecycles(best)
        best = search.fewer_fault_kinds(best)
        best = search.fewer_workload_kinds(best)
        best = search.fewer_faults(best)
        best = search.fewer_fault_kinds(best)  # A kind none of the kept faults is of.
        best = search.fewer_lifecycles(best)
    except _OutOfRuns:
        complete = False
        best = _smallest_failing(search, best)
    final = search.reports[best]
    if best.script is not None:  # Only what fired: the same run, and the script says so.
        best = dataclasses.replace(best, script=frozenset(final.fired))
        final = best.run(store_factory)
        search.runs += 1
    return Shrunk(target, start, original_report, best, final, search.runs, complete)


def _smallest_failing(search: _Search, best: Configuration) -> Configuration:
    """Of the failing runs so far (the budget spent mid-step), the smallest."""
    return min(
        search.reports,
        key=lambda c: (c.lifecycles, sum(search.reports[c].faults.values())),
        default=best,
    )


def ddmin(items: Iterable[T], fails: Callable[[Sequence[T]], bool]) -> list[T]:
    """A subsequence of ``items`` that still ``fails``, from which removing any one item
    passes (1-minimal), found by delta debugging; ``fails(items)`` is taken as true, and
    no subsequence is asked about twice."""
    current = list(items)
    verdicts: dict[tuple[T, ...], bool] = {}

    def still_fails(subset: list[T]) -> bool:
        key = tuple(subset)
        if key not in verdicts:
            verdicts[key] = fails(subset)
        return verdicts[key]

    if current and still_fails([]):
        return []
    parts = 2
    while len(current) >= 2:
        size = -(-len(current) // parts)  # Ceiling: at most ``parts`` chunks.
        chunks = [current[i : i + size] for i in range(0, len(current), size)]
        reduced = next((chunk for chunk in chunks if still_fails(chunk)), None)
        if reduced is not None:
            current, parts = reduced, 2
            continue
        if len(chunks) > 2:  # With two, each complement is the other chunk, just tried.
            for index in range(len(chunks)):
                rest = [item for i, chunk in enumerate(chunks) if i != index for item in chunk]
                if still_fails(rest):
                    reduced = rest
                    break
        if reduced is not None:
            current, parts = reduced, max(parts - 1, 2)
        elif parts >= len(current):
            break
        else:
            parts = min(parts * 2, len(current))
    return current
