"""``tasklease simulate``: the seeded simulation of Cloud Tasks, Cloud Scheduler, worker
instances and a store, its history checked (tasklease.testing.simulation).

It prints each violation (each carries the command that replays it), then ends with one
line: ``N lifecycles, N deliveries, N faults, N violations, trace hash <hex>``. Exit codes:
0 no violation, 1 violations, 2 bad usage or a store it cannot set up.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from tasklease.cli.common import Subcommands, add_command

if TYPE_CHECKING:
    from tasklease.testing.simulation.run import SimulationReport
    from tasklease.testing.simulation.shrink import Configuration
    from tasklease.worker.stores.base.store import LeaseStore

NAME = "simulate"
# As tasklease.testing.simulation.stores.STORE_NAMES (not imported here: every command
# would load the simulation to build its parser; a test keeps the two the same).
STORES = ("memory", "sqlite", "postgres", "firestore", "spanner")
OK, VIOLATIONS, USAGE = 0, 1, 2


def register(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        NAME,
        "run the seeded simulation of Cloud Tasks, a worker fleet and a store, and check "
        "its history",
        epilog="exit status: 0 no violation, 1 violations, 2 bad usage or a store it cannot set up",
    )
    parser.add_argument(
        "--store", default="memory", help=f"the store to simulate on: {', '.join(STORES)}"
    )
    parser.add_argument("--seed", type=int, default=1, help="the seed every choice comes from")
    parser.add_argument("--lifecycles", type=int, default=2000, help="lifecycles to start")
    parser.add_argument(
        "--faults",
        default=None,
        help="fault kinds on, comma-separated, or none (default: every kind)",
    )
    parser.add_argument(
        "--rates",
        default=None,
        metavar="KIND=P,...",
        help="fault probabilities apart from the defaults (per opportunity), as a replay "
        "names them, e.g. slow_request=0.05,duplicate=0.2",
    )
    parser.add_argument(
        "--workload",
        default=None,
        help=(
            "workload kinds, comma-separated, of keyed_task, concurrency_key, scheduled_job, "
            "manual_run, exclusive_job, transactional, outbox, steps, continuation, fan_out, "
            "fan_in, waits (default: every kind the store runs)"
        ),
    )
    parser.add_argument(
        "--keep-faults",
        default=None,
        metavar="KIND:N,...",
        help="let only these faults fire, each the N-th of its kind (from 0), or none, as a "
        "shrunk run's replay names them (default: every fault drawn fires)",
    )
    parser.add_argument(
        "--shrink",
        action="store_true",
        help="on a violation, search for the smallest run that still fails it and print its "
        "replay command",
    )
    parser.add_argument(
        "--shrink-runs", type=int, default=400, help="most simulations the shrinking runs"
    )
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the full event trace there, one event a line (default: none)",
    )


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Carry out one ``tasklease simulate``; return the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        configuration = _configuration(args)
    except ValueError as exc:
        return _usage(err, str(exc))
    from tasklease.errors import StoreUnavailable  # noqa: PLC0415 - on use only.
    from tasklease.testing.simulation.stores import store_factory  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="tasklease-simulate-") as directory:
        try:
            factory = store_factory(configuration.store, Path(directory))
            report = configuration.run(factory, keep_trace=args.trace is not None)
        except ValueError as exc:  # ConfigurationError among them: what the store needs.
            return _usage(err, str(exc))
        except StoreUnavailable as exc:
            return _usage(err, f"the {configuration.store} store could not be reached: {exc}")
        if args.trace is not None:
            args.trace.write_text("".join(f"{line}\n" for line in report.trace))
        for violation in report.violations:
            print(violation, file=out)
        if report.violations and args.shrink:
            _shrink(configuration, report, factory, max_runs=args.shrink_runs, out=out, err=err)
    print(report.line(), file=out)
    return VIOLATIONS if report.violations else OK


def _configuration(args: argparse.Namespace) -> Configuration:
    """The run the flags ask for; ValueError naming a bad flag and what it takes."""
    from tasklease.testing.simulation.faults import FAULT_KINDS, FaultPlan  # noqa: PLC0415
    from tasklease.testing.simulation.replay import (  # noqa: PLC0415
        parse_kinds,
        parse_rates,
        parse_script,
    )
    from tasklease.testing.simulation.shrink import Configuration  # noqa: PLC0415
    from tasklease.testing.simulation.workload import WORKLOAD_KINDS, Workload  # noqa: PLC0415

    if args.store not in STORES:
        raise ValueError(f"unknown --store {args.store!r}: choose one of {', '.join(STORES)}")
    if args.lifecycles < 1:
        raise ValueError(f"--lifecycles must be at least 1, not {args.lifecycles}")
    if args.shrink_runs < 1:
        raise ValueError(f"--shrink-runs must be at least 1, not {args.shrink_runs}")
    faults: frozenset[str] = frozenset(FAULT_KINDS)
    workload: frozenset[str] = frozenset(WORKLOAD_KINDS)
    try:
        if args.faults is not None:
            faults = FaultPlan.only(parse_kinds(args.faults)).kinds
    except ValueError as exc:
        raise ValueError(f"--faults: {exc}") from None
    try:
        if args.workload is not None:
            workload = Workload.only(parse_kinds(args.workload)).kinds
    except ValueError as exc:
        raise ValueError(f"--workload: {exc}") from None
    if not workload:
        raise ValueError(f"--workload: name at least one of {', '.join(WORKLOAD_KINDS)}")
    try:
        script = None if args.keep_faults is None else parse_script(args.keep_faults)
    except ValueError as exc:
        raise ValueError(f"--keep-faults: {exc}") from None
    try:
        rates = {} if args.rates is None else parse_rates(args.rates)
        FaultPlan().with_rates(rates)
    except ValueError as exc:
        raise ValueError(f"--rates: {exc}") from None
    return Configuration(
        args.store,
        args.seed,
        args.lifecycles,
        faults,
        workload,
        script,
        tuple(sorted(rates.items())),
    )


def _shrink(
    configuration: Configuration,
    report: SimulationReport,
    factory: Callable[[], LeaseStore],
    *,
    max_runs: int,
    out: TextIO,
    err: TextIO,
) -> None:
    from tasklease.testing.simulation.shrink import shrink  # noqa: PLC0415

    print("shrinking (each step kept while the same invariant fails):", file=err, flush=True)
    shrunk = shrink(
        factory,
        configuration,
        report=report,
        max_runs=max_runs,
        progress=lambda line: print(f"  {line}", file=err, flush=True),
    )
    print(shrunk.summary(), file=out)


def _usage(err: TextIO, message: str) -> int:
    print(f"tasklease simulate: {message}", file=err)
    return USAGE
