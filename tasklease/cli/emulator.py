"""``tasklease emulator``: the local Cloud Tasks and Cloud Scheduler, in the foreground."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from tasklease.cli.common import (
    DEFAULT_EMULATOR_PORT,
    Subcommands,
    add_command,
    log_to_terminal,
    stop_on_sigterm,
    wait,
)
from tasklease.cli.ports import Port, first_clash

if TYPE_CHECKING:
    from tasklease.emulator import CloudTasksEmulator
    from tasklease.jobs import Job

NAME = "emulator"


def register(commands: Subcommands) -> None:
    add_emulator_options(add_command(commands, NAME, "serve the local Cloud Tasks emulator"))


def add_emulator_options(parser: argparse.ArgumentParser) -> None:
    """The emulator's flags, shared with ``tasklease dev``."""
    parser.add_argument("--host", default="127.0.0.1", help="the address the emulator binds")
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        help="another Host header name to answer, repeatable (default: only loopback names "
        "and --host)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_EMULATOR_PORT,
        help="the REST port (Cloud Tasks and Scheduler)",
    )
    parser.add_argument(
        "--grpc-port", type=int, default=None, help="Cloud Tasks over gRPC (default: --port + 1)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".tasklease/emulator"),
        help="where queues, tasks and jobs persist",
    )
    parser.add_argument(
        "--dedup-window",
        type=float,
        default=3600.0,
        help="seconds a task name stays taken after the task ran or was deleted",
    )
    parser.add_argument(
        "--duplicate-probability",
        type=float,
        default=0.0,
        help="chance an attempt is sent twice at once",
    )
    parser.add_argument(
        "--lost-response-probability",
        type=float,
        default=0.0,
        help="chance the target's answer is dropped and the task retried",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="seed of the faults (default: a new one each run)"
    )
    parser.add_argument(
        "--scheduler-config",
        type=Path,
        default=None,
        help="TOML file of [[job]] tables (default: no Scheduler jobs)",
    )


@contextmanager
def serving_emulator(
    args: argparse.Namespace,
    default_service_account: str | None = None,
    declared: Sequence[Job] = (),
) -> Iterator[CloudTasksEmulator]:
    """The emulator the flags of :func:`add_emulator_options` describe, while the block runs.
    Its Scheduler jobs are ``declared`` (a router's, ``tasklease dev``'s) with the
    ``--scheduler-config`` tables over them (tasklease.jobs.parse_jobs). Jobs whose table
    names no ``service_account`` are signed as ``default_service_account`` (``tasklease
    dev``'s invoker, the account its worker accepts), when given."""
    from tasklease.emulator import CloudTasksEmulator, Faults, load_jobs  # noqa: PLC0415
    from tasklease.emulator.scheduler import emulated  # noqa: PLC0415

    if args.scheduler_config:
        jobs = load_jobs(args.scheduler_config, declared)
    else:
        jobs = [emulated(job) for job in declared]
    if default_service_account:
        jobs = [
            job if job.service_account else replace(job, service_account=default_service_account)
            for job in jobs
        ]
    faults = Faults(args.duplicate_probability, args.lost_response_probability, args.seed)
    with CloudTasksEmulator(
        data_dir=args.data_dir,
        host=args.host,
        port=args.port,
        grpc_port=args.grpc_port,
        dedup_window=args.dedup_window,
        faults=faults,
        jobs=jobs,
        allowed_hosts=args.allow_host,
    ) as emulator:
        logging.getLogger("tasklease.cli").info(
            "Cloud Tasks emulator: REST on %s, gRPC on %s (OIDC keys: %s)",
            emulator.url,
            emulator.grpc_target,
            emulator.certs_url,
        )
        yield emulator


def run(args: argparse.Namespace) -> int:
    grpc = args.grpc_port if args.grpc_port is not None else (args.port + 1 if args.port else 0)
    clash = first_clash(
        [
            Port(args.host, args.port, "the emulator's REST API", "--port"),
            Port("127.0.0.1", grpc, "the emulator's gRPC API", "--grpc-port"),
        ]
    )
    if clash:
        print(f"tasklease emulator: {clash}", file=sys.stderr)
        return 1
    log_to_terminal()
    stop = stop_on_sigterm()
    with serving_emulator(args):
        return wait(stop)
