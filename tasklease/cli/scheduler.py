"""``tasklease scheduler run JOB``: run an emulated Cloud Scheduler job now."""

from __future__ import annotations

import argparse
import sys

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
    """Trigger the job; say so, or which jobs exist when there is none of that name."""
    try:
        response = requests.post(  # JSON: the emulator refuses other state changes.
            f"{args.emulator}/emulator/scheduler/jobs/{args.job}:run", json={}, timeout=10
        )
    except requests.ConnectionError:
        print(
            f"tasklease scheduler: no emulator answers on {args.emulator}: start tasklease dev "
            "(or tasklease emulator), or give --emulator URL",
            file=sys.stderr,
        )
        return 1
    if response.ok:
        print(f"job {args.job} triggered: the emulator delivers its run to the worker now")
        return 0
    try:
        answer = response.json()
    except ValueError:
        answer = {}
    if response.status_code == 404 and isinstance(answer, dict) and "jobs" in answer:
        jobs = answer["jobs"]
        known = (
            "the jobs are: " + ", ".join(jobs)
            if jobs
            else "it has no jobs (give tasklease dev --scheduler-config FILE of [[job]] tables)"
        )
        print(f"tasklease scheduler: no job {args.job!r} in the emulator; {known}", file=sys.stderr)
        return 1
    text = answer.get("error") if isinstance(answer, dict) else None
    print(
        f"tasklease scheduler: the emulator answered {response.status_code}: "
        f"{text or response.text.strip()}",
        file=sys.stderr,
    )
    return 1
