"""``tasklease demo``: the example shop end to end on the emulator, faults injected."""

from __future__ import annotations

import argparse

from tasklease.cli.common import Subcommands, add_command

NAME = "demo"


def register(commands: Subcommands) -> None:
    parser = add_command(commands, NAME, "run the example shop end to end, faults injected")
    parser.add_argument("--orders", type=int, default=200, help="orders the shop takes")
    parser.add_argument("--customers", type=int, default=25, help="customers placing them")
    parser.add_argument(
        "--duplicate-probability",
        type=float,
        default=0.2,
        help="chance the emulator sends an attempt twice at once",
    )
    parser.add_argument(
        "--lost-response-probability",
        type=float,
        default=0.2,
        help="chance the emulator drops the worker's answer and retries",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="seed of the faults (default: a new one each run)"
    )
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")


def run(args: argparse.Namespace) -> int:
    from tasklease.demo.run import DemoSettings, run_demo  # noqa: PLC0415 - heavy imports.

    return run_demo(
        DemoSettings(
            args.orders,
            args.customers,
            args.duplicate_probability,
            args.lost_response_probability,
            args.seed,
            args.workers,
        )
    )
