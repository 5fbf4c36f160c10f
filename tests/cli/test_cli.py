"""The command line's shape: one module per subcommand, every flag's help stating its default,
and a reader that goes away (`tasklease runs show ... | head`) ending it without a traceback."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease import cli
from tasklease.cli.common import help_with_default
from tasklease.testing.operations_contract import seed_every_state
from tasklease.worker.stores import SqliteStore

BIN = Path(sys.executable).parent


def parsers(parser: argparse.ArgumentParser, path: str = "tasklease") -> Iterator[tuple[str, Any]]:
    """``parser`` and every subcommand's parser under it, with the command line naming it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parsers(child, f"{path} {name}")


def test_each_subcommand_is_a_module_that_registers_and_runs_it() -> None:
    names = [module.NAME for module in cli.SUBCOMMANDS]
    assert names == [
        "demo",
        "emulator",
        "scheduler",
        "dev",
        "deploy",
        "runs",
        "locks",
        "dashboard",
        "outbox",
        "simulate",
    ]
    for module in cli.SUBCOMMANDS:
        assert module.__name__ == f"tasklease.cli.{module.NAME}"
        assert callable(module.register) and callable(module.run)
    chosen = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert chosen.choices is not None
    assert list(chosen.choices) == names


def test_every_flag_has_a_help_text_that_states_its_default() -> None:
    unstated = []
    for path, parser in parsers(cli.build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                continue
            optional = action.option_strings or action.nargs == argparse.OPTIONAL
            text = help_with_default(action)
            if not action.help or (optional and "default" not in text):
                unstated.append(f"{path} {action.option_strings or action.dest}: {text!r}")
    assert unstated == []


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (["runs", "list"], "--limit LIMIT runs on a page (default: 50)"),
        (["runs", "list"], "--json print JSON for programs (default: off)"),
        (["runs", "stuck"], "(default: 15m)"),
        (["locks", "list"], "--limit LIMIT locks listed at most (default: 100)"),
        (["dev"], "--worker-port WORKER_PORT the worker's port (default: 8080)"),
        (["emulator"], "--data-dir DATA_DIR where queues, tasks and jobs persist (default: "),
        (["deploy"], "--gcloud GCLOUD the gcloud executable (default: gcloud)"),
    ],
)
def test_help_prints_each_flags_default(
    command: list[str], shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([*command, "--help"])
    assert exited.value.code == 0
    assert shown in " ".join(capsys.readouterr().out.split())  # As one line, unwrapped.


def test_a_reader_that_goes_away_ends_runs_show_without_a_traceback(tmp_path: Path) -> None:
    """`tasklease runs show ... | head -1`: the pipe closes before the command has written."""
    store = SqliteStore(tmp_path / "runs.db")
    seed_every_state(store, datetime.now(UTC) - timedelta(hours=1))
    store.close()
    read, write = os.pipe()
    os.close(read)  # The reader is gone before the first write: every write meets EPIPE.
    try:
        shown = subprocess.run(
            [
                BIN / "tasklease",
                "runs",
                "show",
                "failed",
                "--store",
                f"sqlite:///{tmp_path}/runs.db",
            ],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert shown.stderr == ""
    assert shown.returncode == 128 + signal.SIGPIPE  # As a command SIGPIPE ended.


def test_no_help_text_carries_restructuredtext_markup() -> None:
    marked = []
    for path, parser in parsers(cli.build_parser()):
        texts = [parser.description or "", parser.epilog or ""]
        texts += [action.help or "" for action in parser._actions]
        marked += [f"{path}: {text!r}" for text in texts if re.search(r"``|:\w+:`", text)]
    assert marked == []


def test_replay_without_a_producer_environment_exits_1_as_documented(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("PROJECT", "LOCATION", "QUEUE", "WORKER_URL", "SERVICE_ACCOUNT"):
        monkeypatch.delenv(f"TASKLEASE_{name}", raising=False)
    store = SqliteStore(tmp_path / "runs.db")
    seed_every_state(store, datetime.now(UTC) - timedelta(hours=1))
    store.close()
    code = cli.main(["runs", "replay", "failed", "--store", f"sqlite:///{tmp_path}/runs.db"])
    assert code == 1
    assert "the producer is not configured" in capsys.readouterr().err
