"""``tasklease scheduler run JOB``: run an emulated Cloud Scheduler job now."""

from __future__ import annotations

import argparse

import requests

from tasklease.cli.common import DEFAULT_EMULATOR_URL, Subcommands, add_command

NAME = "scheduler"


def register(commands: Subcommands) -> None:
    parser = add_command(commands, NAME, "drive the emulator's Cloud Scheduler")
    actions = parser.add_subparsers(dest="scheduler_command", required=True)
    run_now = add_command(actions, "run", "run a job now, like gcloud scheduler jobs run")
    run_now.add_argument("job", help="the job's name, as its [[job]] table gives it")
    run_now.add_argument("--emulator", default=DEFAULT_EMULATOR_URL, help="the emulator's URL")


def run(args: argparse.Namespace) -> int:
    response = requests.post(  # JSON: the emulator refuses other state changes.
        f"{args.emulator}/emulator/scheduler/jobs/{args.job}:run", json={}, timeout=10
    )
    print(response.text.strip())
    return 0 if response.ok else 1
