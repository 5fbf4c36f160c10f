"""The simulation soak (``make soak``): many seeds of the seeded simulation in sequence, spread
over worker processes, with a progress bar on stderr; then a table of lifecycles, deliveries
and faults by kind for each store, and the violations (each with its replay command), written
into BENCHMARKS.md as the section "Simulation soak" (replaced on each run).

    python -m bench.simulation_soak --lifecycles 1000000            # make soak
    python -m bench.simulation_soak --lifecycles 20000 --stores sqlite,memory

Seeds ``--first-seed``, ``--first-seed + 1``, ... run ``--per-seed`` lifecycles each (the
last fewer if need be), so a violation replays as ``tasklease simulate --store S --seed N
--lifecycles M``. It lives in bench/, not in the package: it writes this repository's
BENCHMARKS.md and reads this machine; the part a user needs is ``tasklease simulate``.
Exit status 1 if any seed broke an invariant.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import os
import platform
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]
FULL = 1_000_000  # Lifecycles of the full soak, as `make soak` runs it.
# One process more than cores: a seed's threads hand the baton to each other, which leaves its
# core idle about a quarter of the time (one SQLite seed of 2,000 alone: 27 s wall, 20 s CPU).
PROCESSES = (os.cpu_count() or 1) + 1
# The stores' files go to memory where the system has a RAM file system: what the simulation
# checks does not depend on fsync (its kills are virtual: no process dies in a write), and the
# fsyncs of SQLite's synchronous=FULL are a tenth of a seed's time on disk.
SCRATCH = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
SECTION = "## Simulation soak"
BAR_WIDTH = 30


@dataclass(frozen=True)
class Job:
    store: str
    seed: int
    lifecycles: int


@dataclass(frozen=True)
class SeedResult:
    job: Job
    deliveries: int
    faults: dict[str, int]
    violations: tuple[str, ...]
    seconds: float


@dataclass
class Totals:
    """What the seeds of one store added up to."""

    seeds: int = 0
    lifecycles: int = 0
    deliveries: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def add(self, result: SeedResult) -> None:
        self.seeds += 1
        self.lifecycles += result.job.lifecycles
        self.deliveries += result.deliveries
        self.faults.update(result.faults)
        self.violations += result.violations


def jobs(stores: Sequence[str], lifecycles: int, per_seed: int, first_seed: int) -> list[Job]:
    """``lifecycles`` for each store, ``per_seed`` a seed (the last seed what is left)."""
    planned = []
    for store in stores:
        left, seed = lifecycles, first_seed
        while left > 0:
            planned.append(Job(store, seed, min(per_seed, left)))
            left -= per_seed
            seed += 1
    return planned


def run_job(job: Job) -> SeedResult:
    """One seed, on a fresh store in a directory of its own (removed after)."""
    from tasklease.testing.simulation import simulate  # noqa: PLC0415 - in the worker.
    from tasklease.testing.simulation.stores import store_factory  # noqa: PLC0415

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tasklease-soak-", dir=SCRATCH) as directory:
        report = simulate(
            store_factory(job.store, Path(directory)),
            seed=job.seed,
            lifecycles=job.lifecycles,
            store_name=job.store,
        )
    return SeedResult(
        job,
        report.deliveries,
        dict(report.faults),
        report.violations,
        time.perf_counter() - started,
    )


class Progress:
    """One line on stderr: a bar, seeds and lifecycles done, violations, time left. On a
    terminal it is rewritten in place; elsewhere (a CI log) a line every 5 percent."""

    def __init__(self, total: int, out: TextIO) -> None:
        self.total, self.out = total, out
        self.tty = out.isatty()
        self.started = time.monotonic()
        self.done = self.seeds = self.violations = 0
        self.last_step = -1

    def advance(self, result: SeedResult) -> None:
        self.done += result.job.lifecycles
        self.seeds += 1
        self.violations += len(result.violations)
        clear = "\r\033[K" if self.tty else ""
        for violation in result.violations:  # Above the bar, as soon as it is known.
            self.out.write(f"{clear}{violation}\n")
        step = self.done * 20 // self.total
        if self.tty:
            self.out.write(f"\r{self.line()}")
        elif step != self.last_step:
            self.out.write(f"{self.line()}\n")
        self.last_step = step
        self.out.flush()

    def line(self) -> str:
        share = self.done / self.total
        filled = int(share * BAR_WIDTH)
        elapsed = time.monotonic() - self.started
        left = elapsed / share - elapsed if share else 0.0
        return (
            f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {share:4.0%} "
            f"{self.done:,}/{self.total:,} lifecycles, {self.seeds} seeds, "
            f"{self.violations} violations, {span(elapsed)} elapsed, ~{span(left)} left"
        )

    def finish(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


def soak(planned: Sequence[Job], processes: int, progress: Progress) -> dict[str, Totals]:
    """Every job, over ``processes`` worker processes (1: in this one)."""
    totals = {job.store: Totals() for job in planned}
    if processes == 1:
        for result in map(run_job, planned):
            totals[result.job.store].add(result)
            progress.advance(result)
    else:
        # spawn: the simulation runs threads; a fresh interpreter per worker shares none.
        context = multiprocessing.get_context("spawn")
        with context.Pool(processes) as pool:
            for result in pool.imap_unordered(run_job, planned):
                totals[result.job.store].add(result)
                progress.advance(result)
    progress.finish()
    return totals


def table(totals: dict[str, Totals], fault_kinds: Sequence[str]) -> str:
    """Lifecycles, deliveries and faults (each kind) down, the stores across."""
    stores = list(totals)
    rows: list[tuple[str, ...]] = [("", *stores)]
    rows.append(("seeds", *(f"{totals[s].seeds:,}" for s in stores)))
    rows.append(("lifecycles", *(f"{totals[s].lifecycles:,}" for s in stores)))
    rows.append(("deliveries", *(f"{totals[s].deliveries:,}" for s in stores)))
    rows.append(("faults", *(f"{sum(totals[s].faults.values()):,}" for s in stores)))
    for kind in fault_kinds:
        rows.append((f"  {kind}", *(f"{totals[s].faults[kind]:,}" for s in stores)))
    rows.append(("violations", *(f"{len(totals[s].violations):,}" for s in stores)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    )


def section(
    command: str,
    totals: dict[str, Totals],
    counts: str,
    seconds: float,
    lifecycles: int,
    loads: tuple[float, float],
    processes: int,
) -> str:
    """The BENCHMARKS.md section of one soak."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    violations = [v for t in totals.values() for v in t.violations]
    scale = textwrap.fill(
        f"A reduced run: {lifecycles:,} lifecycles a store, not the {FULL:,} of `make soak`; "
        "the full run replaces this section."
        if lifecycles < FULL
        else f"The full soak: {lifecycles:,} lifecycles a store.",
        width=95,
    )
    lines = [
        SECTION,
        "",
        "`make soak` runs the seeded simulation (`tasklease.testing.simulation`: Cloud Tasks,",
        "Cloud Scheduler, a fleet of worker instances and a real store on virtual time, every",
        "fault kind on) over many seeds in sequence, spread over",
        f"{processes} {'process' if processes == 1 else 'processes'}, and checks each history "
        "with the independent checker. Written",
        "by `bench/simulation_soak.py`; each run replaces this section.",
        "",
        scale,
        "",
        f"- Command: `{command}`",
        f"- Date: {now}, commit {_commit()}",
        f"- Machine: {machine()}",
        f"- Wall time: {span(seconds)} (load average {loads[0]:.2f} at the start, "
        f"{loads[1]:.2f} at the end: the cores may have been shared)",
        "",
        "```",
        counts,
        "```",
        "",
    ]
    if violations:
        lines += ["Violations (each with its replay command):", "", "```", *violations, "```", ""]
    return "\n".join(lines)


def replace_section(path: Path, text: str) -> None:
    """Put ``text`` in place of the section ``SECTION`` of ``path`` (up to the next section
    of its level), or at the end when it has none."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    body = text.rstrip("\n") + "\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
    found = pattern.search(old)
    if found is None:
        new = f"{old.rstrip()}\n\n{body}" if old.strip() else body
    else:
        after = old[found.end() :]
        new = old[: found.start()] + body + (f"\n{after}" if after else "")
    path.write_text(new, encoding="utf-8")


def machine() -> str:
    """Cores, processor, memory, Python and system, as this machine reports them."""
    model = ""
    memory = ""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
        model = f" ({found.group(1).strip()})" if found else ""
        meminfo = Path("/proc/meminfo").read_text(encoding="utf-8")
        total = re.search(r"^MemTotal:\s*(\d+) kB", meminfo, re.MULTILINE)
        memory = f", {int(total.group(1)) / 1024**2:.0f} GiB" if total else ""
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores{model}{memory}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}"
    )


def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return done.stdout.strip()


def span(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from tasklease.testing.simulation.stores import STORE_NAMES  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m bench.simulation_soak", description=__doc__)
    parser.add_argument("--lifecycles", type=int, default=FULL, help="lifecycles for each store")
    parser.add_argument("--per-seed", type=int, default=2000, help="lifecycles of one seed")
    parser.add_argument("--first-seed", type=int, default=1, help="the first seed")
    parser.add_argument(
        "--processes", type=int, default=PROCESSES, help="worker processes (cores + 1)"
    )
    parser.add_argument("--stores", default="sqlite", help="comma-separated store names")
    parser.add_argument(
        "--benchmarks",
        type=Path,
        default=ROOT / "BENCHMARKS.md",
        help="the file whose Simulation soak section is replaced",
    )
    parser.add_argument("--no-write", action="store_true", help="write no BENCHMARKS.md section")
    args = parser.parse_args(argv)
    args.stores = [name.strip() for name in args.stores.split(",") if name.strip()]
    unknown = [name for name in args.stores if name not in STORE_NAMES]
    if unknown or not args.stores:
        parser.error(f"--stores: a comma-separated list of {', '.join(STORE_NAMES)}")
    for name in ("lifecycles", "per_seed", "processes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from tasklease.testing.simulation import FAULT_KINDS  # noqa: PLC0415

    args = parse(argv)
    planned = jobs(args.stores, args.lifecycles, args.per_seed, args.first_seed)
    command = (
        f"python -m bench.simulation_soak --lifecycles {args.lifecycles} --per-seed "
        f"{args.per_seed} --processes {args.processes} --stores {','.join(args.stores)}"
    )
    print(f"$ {command}", file=sys.stderr, flush=True)
    started, load_before = time.monotonic(), os.getloadavg()[0]
    totals = soak(planned, args.processes, Progress(args.lifecycles * len(args.stores), sys.stderr))
    seconds = time.monotonic() - started
    counts = table(totals, FAULT_KINDS)
    print(counts)
    print(f"wall time {span(seconds)}")
    if not args.no_write:
        loads = (load_before, os.getloadavg()[0])
        text = section(command, totals, counts, seconds, args.lifecycles, loads, args.processes)
        replace_section(args.benchmarks, text)
        print(f"wrote the {SECTION.removeprefix('## ')} section of {args.benchmarks}")
    return 1 if any(t.violations for t in totals.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
