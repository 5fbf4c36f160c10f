"""The tasklease command line: the demo, the local emulator and dev stack, deploys, runs,
and the seeded simulation."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from tasklease import __version__
from tasklease.cli import (
    dashboard,
    demo,
    deploy,
    dev,
    emulator,
    locks,
    outbox,
    runs,
    scheduler,
    simulate,
)
from tasklease.cli.common import HelpFormatter

# One module per subcommand, in the order ``--help`` lists them: each has ``NAME``,
# ``register(subcommands)`` adding its parser and ``run(args)`` returning the exit code.
SUBCOMMANDS = (demo, emulator, scheduler, dev, deploy, runs, locks, dashboard, outbox, simulate)


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and its flags."""
    parser = argparse.ArgumentParser(
        prog="tasklease", description=__doc__, formatter_class=HelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"tasklease {__version__}")
    commands = parser.add_subparsers(dest="command")
    for module in SUBCOMMANDS:
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    command = {module.NAME: module for module in SUBCOMMANDS}[args.command]
    try:
        code = int(command.run(args))
        sys.stdout.flush()  # Here, where a closed pipe can still be answered.
    except BrokenPipeError:
        # The reader went away (`tasklease runs list | head`): stop quietly, as a command
        # killed by SIGPIPE does. stdout now goes nowhere, so the interpreter's last flush
        # raises nothing (docs.python.org/3/library/signal.html#note-on-sigpipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code
