"""What the subcommands share: the help that states every flag's default, how a subcommand's
parser is made, and serving in the foreground until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any, Protocol

from tasklease.worker.observe.logs import ReadableFormatter, configure_logging


class Subcommands(Protocol):
    """What ``add_subparsers`` returns, the argument of each subcommand's ``register`` (its
    class is private to argparse)."""

    def add_parser(self, name: str, **options: Any) -> argparse.ArgumentParser: ...


DEFAULT_EMULATOR_PORT = 8123
DEFAULT_DASHBOARD_PORT = 8090
DEFAULT_EMULATOR_URL = f"http://127.0.0.1:{DEFAULT_EMULATOR_PORT}"


def help_with_default(action: argparse.Action) -> str:
    """``action``'s help as ``--help`` prints it: its text, then its default unless the text
    states it. An on/off flag is off by default; a flag whose default is None says in its
    text what leaving it out means."""
    text = action.help or ""
    takes_default = action.option_strings or action.nargs in (argparse.OPTIONAL, "*")
    if (
        "default" in text
        or not takes_default
        or action.default is argparse.SUPPRESS  # --help and --version among them.
        or action.default is None
    ):
        return text
    if action.nargs == 0 and action.const is True:  # action="store_true"
        return f"{text} (default: off)"
    return f"{text} (default: %(default)s)"


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, every flag's help ending with its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return help_with_default(action)


def add_command(
    commands: Subcommands, name: str, help: str, **options: Any
) -> argparse.ArgumentParser:
    """A (sub)command's parser, its help stating every default."""
    return commands.add_parser(
        name, help=help, description=help, formatter_class=HelpFormatter, **options
    )


def log_to_terminal() -> None:
    """Readable log lines for a command serving in the foreground, every logger's (the
    dashboard's werkzeug too) in tasklease's one text format; gunicorn inherits the choice."""
    os.environ.setdefault("TASKLEASE_LOG_FORMAT", "text")
    root = logging.getLogger()
    if os.environ["TASKLEASE_LOG_FORMAT"].lower() == "text" and not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(ReadableFormatter())
        root.addHandler(handler)
        root.setLevel(logging.INFO)
    configure_logging()


def stop_on_sigterm() -> threading.Event:
    """An event SIGTERM and Ctrl-C (SIGINT) set, for :func:`wait`: a Ctrl-C at any moment,
    even between two statements of the start-up, stops the command the same orderly way
    rather than as a KeyboardInterrupt raised wherever it lands."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def wait(stop: threading.Event) -> int:
    """Block until ``stop`` is set or Ctrl-C; the exit code 0."""
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    return 0
