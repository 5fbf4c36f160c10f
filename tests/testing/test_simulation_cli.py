"""`tasklease simulate`: the same seed prints the same counts and trace hash, each violation
is printed with its replay command before the summary line the command ends with, exit 1
on any, the trace written whole, and every bad input refused in one line with exit 2."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from unittest import mock

import pytest

from tasklease import cli
from tasklease.cli.simulate import STORES
from tasklease.testing.simulation.stores import STORE_NAMES
from tasklease.worker.core import decisions

SUMMARY = re.compile(
    r"^(\d+) lifecycles, (\d+) deliveries, (\d+) faults, (\d+) violations, "
    r"trace hash ([0-9a-f]{64})$"
)


def simulate(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, list[str], str]:
    code = cli.main(["simulate", *flags])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def test_a_seed_prints_the_same_counts_and_trace_hash_each_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ("--store", "sqlite", "--seed", "7", "--lifecycles", "150")
    code, lines, _ = simulate(capsys, *flags)
    again_code, again, _ = simulate(capsys, *flags)

    assert (code, again_code) == (0, 0)
    assert lines == again
    summary = SUMMARY.match(lines[-1])
    assert summary is not None, lines
    assert summary.group(1) == "150" and summary.group(4) == "0"
    assert int(summary.group(3)) > 0  # Every fault kind is on by default.
    assert len(lines) == 1


def test_the_trace_file_holds_every_event_its_hash_covers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.txt"

    code, lines, _ = simulate(capsys, "--seed", "3", "--lifecycles", "40", "--trace", str(trace))

    summary = SUMMARY.match(lines[-1])
    assert code == 0 and summary is not None
    assert hashlib.sha256(trace.read_bytes()).hexdigest() == summary.group(5)
    assert any(" FAULT " in line for line in trace.read_text().splitlines())


def test_faults_none_runs_without_faults(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = simulate(capsys, "--seed", "3", "--lifecycles", "40", "--faults", "none")

    summary = SUMMARY.match(lines[-1])
    assert code == 0 and summary is not None
    assert summary.group(3) == "0"


def test_violations_are_printed_with_their_replay_then_the_summary_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with mock.patch.object(decisions, "lease_held", lambda record, now: False):
        code, lines, err = simulate(capsys, "--seed", "1", "--lifecycles", "120", "--shrink")

    assert code == 1
    summary = SUMMARY.match(lines[-1])
    assert summary is not None
    violations = [line for line in lines[:-1] if not line.startswith("shrunk ")]
    assert len(violations) == int(summary.group(4)) > 0
    assert all(
        line.endswith("replay: tasklease simulate --store memory --seed 1 --lifecycles 120")
        for line in violations
    )
    (shrunk,) = [line for line in lines if line.startswith("shrunk ")]
    assert "--keep-faults " in shrunk
    assert "lifecycles 120 -> " in err  # The search's steps, on stderr.


def test_a_run_with_its_own_rates_replays_from_the_command_its_violations_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ["--seed", "2", "--lifecycles", "60", "--rates", "stall=0.05,slow_request=0.1"]
    with mock.patch.object(decisions, "lease_held", lambda record, now: False):
        code, lines, _ = simulate(capsys, *flags)
        replay = lines[0].rsplit("replay: ", 1)[1]
        again_code, again, _ = simulate(capsys, *replay.split()[2:])

    assert code == again_code == 1
    assert replay.endswith("--lifecycles 60 --rates slow_request=0.1,stall=0.05")
    assert again == lines
    calm = simulate(capsys, *flags[:4])[1][-1]
    assert SUMMARY.match(calm) and calm != lines[-1]  # The rates made another run.


def test_the_store_names_are_the_simulations() -> None:
    assert STORES == STORE_NAMES


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--store", "mysql"], "unknown --store 'mysql': choose one of memory, sqlite,"),
        (["--lifecycles", "0"], "--lifecycles must be at least 1, not 0"),
        (["--faults", "kill,meteor"], "--faults: unknown fault kind(s) meteor: choose from kill,"),
        (["--workload", "cron"], "--workload: unknown workload kind(s) cron: choose from"),
        (["--workload", "none"], "--workload: name at least one of keyed_task,"),
        (["--keep-faults", "kill"], "--keep-faults: bad fault occurrence 'kill': write KIND:N"),
        (["--shrink-runs", "0"], "--shrink-runs must be at least 1"),
        (["--rates", "stall"], "--rates: bad fault probability 'stall': write KIND=P"),
        (["--rates", "stall=often"], "--rates: bad fault probability 'stall=often'"),
        (["--rates", "clock_skew=0.1"], "--rates: no probability to set for clock_skew: choose"),
        (["--rates", "stall=1.5"], "--rates: the probability of stall must lie in [0, 1], not 1.5"),
        (["--workload", "transactional"], "the memory store runs none of the workload kinds"),
        (["--store", "postgres"], "TASKLEASE_STORE"),
        (["--store", "firestore"], "FIRESTORE_EMULATOR_HOST"),
        (["--store", "spanner"], "SPANNER_EMULATOR_HOST"),
    ],
)
def test_bad_input_is_refused_in_one_line_naming_the_fix(
    flags: list[str],
    named: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in ("TASKLEASE_STORE", "FIRESTORE_EMULATOR_HOST", "SPANNER_EMULATOR_HOST"):
        monkeypatch.delenv(variable, raising=False)

    code, lines, err = simulate(capsys, "--lifecycles", "5", *flags)  # A later flag wins.

    assert code == 2
    assert lines == []
    assert len(err.splitlines()) == 1
    assert err.startswith("tasklease simulate: ")
    assert named in err
