"""bench.simulation_soak (`make soak`): seeds planned to the lifecycle, a progress line that
does not flood a log, a table of lifecycles x faults x stores, and its BENCHMARKS.md section
replaced in place, never duplicated, the rest of the file untouched."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from bench.simulation_soak import (
    SECTION,
    Job,
    Progress,
    SeedResult,
    jobs,
    main,
    replace_section,
)


def test_seeds_run_the_lifecycles_asked_for_the_last_seed_what_is_left() -> None:
    planned = jobs(["sqlite", "memory"], 5000, 2000, first_seed=7)

    assert planned[:3] == [Job("sqlite", 7, 2000), Job("sqlite", 8, 2000), Job("sqlite", 9, 1000)]
    assert [job.seed for job in planned[3:]] == [7, 8, 9]  # Each store the same seeds.
    assert sum(job.lifecycles for job in planned) == 10_000


def test_progress_in_a_log_is_a_line_every_twentieth_not_every_seed() -> None:
    out = io.StringIO()
    progress = Progress(total=1000, out=out)
    for seed in range(100):
        result = SeedResult(Job("sqlite", seed, 10), 12, {"kill": 1}, (), 0.1)
        progress.advance(result)

    lines = out.getvalue().splitlines()
    assert len(lines) == 21  # 0%, 5%, ..., 100%.
    assert lines[-1].startswith("[" + "#" * 30 + "] 100% 1,000/1,000 lifecycles, 100 seeds")
    assert "\r" not in out.getvalue()


def test_a_section_is_replaced_in_place_or_added_at_the_end(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\n## Before\n\ntext\n\n## After\n\nmore\n")

    replace_section(path, f"{SECTION}\n\nfirst\n")
    assert path.read_text().endswith(f"more\n\n{SECTION}\n\nfirst\n")

    path.write_text(path.read_text().replace(f"{SECTION}\n\nfirst\n", "") + "## Later\n\nz\n")
    replace_section(path, f"{SECTION}\n\nsecond\n")
    replace_section(path, f"{SECTION}\n\nthird\n")
    text = path.read_text()
    assert text.count(SECTION) == 1
    assert "first" not in text and "second" not in text
    assert text.endswith(f"{SECTION}\n\nthird\n")

    path.write_text(f"# B\n\n{SECTION}\n\nold\n\n## After\n\nmore\n")
    replace_section(path, f"{SECTION}\n\nnew\n")
    assert path.read_text() == f"# B\n\n{SECTION}\n\nnew\n\n## After\n\nmore\n"


def test_a_small_soak_prints_its_table_and_writes_it_labelled_as_reduced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    benchmarks = tmp_path / "BENCHMARKS.md"
    benchmarks.write_text("# Benchmarks\n")

    flags = ["--lifecycles", "30", "--per-seed", "15", "--processes", "1", "--stores", "memory"]
    code = main([*flags, "--benchmarks", str(benchmarks)])

    out = capsys.readouterr().out
    assert code == 0
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert rows["seeds"] == ["2"] and rows["lifecycles"] == ["30"]
    assert rows["violations"] == ["0"] and "kill" in rows
    written = benchmarks.read_text()
    assert written.startswith(f"# Benchmarks\n\n{SECTION}\n")
    assert "A reduced run: 30 lifecycles a store, not the 1,000,000 of `make soak`" in written
    assert "--lifecycles 30 --per-seed 15 --processes 1 --stores memory" in written
    assert "spread over\n1 process, and checks each history" in written


def test_an_unknown_store_stops_before_any_seed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--stores", "sqlite,oracle", "--no-write"])

    assert stopped.value.code == 2
    assert "--stores: a comma-separated list of memory, sqlite," in capsys.readouterr().err
