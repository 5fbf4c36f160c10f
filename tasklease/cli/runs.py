"""``tasklease runs``: list, show, stuck, release, replay and cancel runs in the configured
store.

Tables for people, ``--json`` for programs. Exit codes (:class:`Exit`): 0 done, 1 the store
or the producer failed, 2 bad usage, 3 no such run, 4 refused (a live lease, a run that is
not failed, a run that ended before its cancel...), 5 ``stuck`` found something.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from enum import IntEnum
from pathlib import Path
from typing import Any, TextIO

from tasklease.cli import refused
from tasklease.cli.code_schedules import add_router_option, code_schedules
from tasklease.cli.common import Subcommands, add_command
from tasklease.cli.store_choice import STORE_HELP, open_existing_store
from tasklease.errors import ConfigurationError, StoreUnavailable
from tasklease.producer import EnqueueError, Producer
from tasklease.protocol import rfc3339_or_none
from tasklease.worker.core import fan_in, steps, waits
from tasklease.worker.core.cancellation import CancelOutcome
from tasklease.worker.core.decisions import ReleaseOutcome
from tasklease.worker.core.queries import RunFilter, parse_duration
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.core.waits import SignalError, Signalled
from tasklease.worker.observe.logs import escape_controls
from tasklease.worker.operate.cancels import cancel_run
from tasklease.worker.operate.operations import (
    OperationRefused,
    Operations,
    ProducerNotConfigured,
    StuckReport,
    run_summary,
)
from tasklease.worker.operate.redaction import redacted_bodies
from tasklease.worker.operate.run_ids import AmbiguousRunId
from tasklease.worker.operate.stuck_schedules import (
    DEFAULT_GRACE,
    OverdueJob,
    default_schedules,
    load_schedules,
)
from tasklease.worker.stores import LeaseStore, store_from_url


class Exit(IntEnum):
    OK = 0
    FAILED = 1  # The store or the producer failed.
    USAGE = 2  # argparse's own code for bad arguments.
    NOT_FOUND = 3
    REFUSED = 4
    STUCK = 5  # `runs stuck` found stuck runs or overdue jobs.


NAME = "runs"
STATUSES = [status.value for status in RunStatus]
PRODUCER_FLAGS = ("project", "location", "queue", "worker_url", "service_account")


def register(commands: Subcommands) -> None:
    """Add ``runs`` and its subcommands to the ``tasklease`` parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        default=None,
        help=STORE_HELP,
    )
    common.add_argument("--json", action="store_true", help="print JSON for programs")
    runs = add_command(commands, NAME, "inspect and repair runs in the store")
    actions = runs.add_subparsers(dest="runs_command", required=True)

    listing = add_command(actions, "list", "runs, newest first", parents=[common])
    listing.add_argument(
        "--status", choices=STATUSES, help="only runs in this state (default: any)"
    )
    listing.add_argument("--handler", help="only runs of this handler (default: any)")
    listing.add_argument(
        "--kind", choices=["task", "scheduler"], help="only tasks or Scheduler runs (default: both)"
    )
    listing.add_argument(
        "--older-than", type=_duration, help="claimed longer ago, e.g. 10m (default: any time)"
    )
    listing.add_argument(
        "--newer-than", type=_duration, help="claimed more recently, e.g. 1h (default: any time)"
    )
    trigger = listing.add_mutually_exclusive_group()
    trigger.add_argument("--manual", action="store_true", help="manual Scheduler runs only")
    trigger.add_argument("--not-manual", action="store_true", help="no manual Scheduler runs")
    listing.add_argument("--limit", type=_positive, default=50, help="runs on a page")
    listing.add_argument(
        "--cursor", help="the cursor a previous page printed (default: the first page)"
    )

    show = add_command(actions, "show", "one run in full", parents=[common])
    show.add_argument(
        "run_id",
        metavar="RUN_ID",
        nargs="?",
        help="a run id (or its first 8+ characters), or a Cloud Tasks task name "
        "(default: none: give --job)",
    )
    show.add_argument(
        "--job", help="instead: the newest run of this Scheduler job (default: none: give RUN_ID)"
    )
    show.add_argument(
        "--schedule-time",
        help="with --job: its run for this slot, RFC 3339 (default: its newest run)",
    )

    show.add_argument(
        "--payload",
        action="store_true",
        help="also print the payload and result, secrets masked ($TASKLEASE_REDACT_KEYS, "
        "$TASKLEASE_REDACTOR: see the README)",
    )

    stuck = add_command(
        actions, "stuck", "crashed attempts and jobs that missed their schedule", parents=[common]
    )
    stuck.add_argument(
        "--schedules",
        type=Path,
        help="a TOML file of [[job]] tables: the emulator's jobs file or the deploy config "
        "(default: ./tasklease.toml when there is one)",
    )
    stuck.add_argument(
        "--grace",
        type=_duration,
        default=DEFAULT_GRACE,
        help="how long after its slot a job's run may still be finishing, e.g. 30m "
        f"(default: {_ago(DEFAULT_GRACE)})",
    )
    stuck.add_argument("--limit", type=_positive, default=100, help="stuck runs listed at most")
    add_router_option(stuck)

    release = add_command(
        actions,
        "release",
        "give a run's claim back so the next delivery runs it",
        parents=[common],
    )
    release.add_argument(
        "run_id", metavar="RUN_ID", help="the run to release (its id or first 8+ characters)"
    )
    release.add_argument(
        "--force", action="store_true", help="even while its lease is live (the holder is fenced)"
    )
    release.add_argument(
        "--attempt",
        metavar="ATTEMPT_ID",
        help="only if this attempt (as `runs show` printed it) still holds the run "
        "(default: the attempt holding it when the command starts)",
    )

    replay = add_command(
        actions, "replay", "re-enqueue a failed run's payload, once", parents=[common]
    )
    replay.add_argument(
        "run_id", metavar="RUN_ID", help="the failed run to replay (its id or first 8+ characters)"
    )
    replay.add_argument(
        "--payload",
        type=Path,
        metavar="FILE",
        help="send this JSON file as the payload instead of the failed one, a corrected "
        "input (default: the failed run's own payload)",
    )
    _producer_options(replay)

    signal = add_command(
        actions,
        "signal",
        "send a signal to a run waiting in ctx.wait_for (or about to), resuming it once",
        parents=[common],
    )
    signal.add_argument(
        "run_id", metavar="RUN_ID", help="the run to signal (its id or first 8+ characters)"
    )
    signal.add_argument("name", metavar="NAME", help="the signal's name, as wait_for names it")
    signal.add_argument(
        "--payload",
        type=Path,
        metavar="FILE",
        help="a JSON file: what wait_for returns (default: null; - reads standard input)",
    )
    _producer_options(signal)
    cancel = add_command(
        actions,
        "cancel",
        "cancel a run: it never runs again, nor do its fan-out children that have not run",
        parents=[common],
    )
    cancel.add_argument(
        "run_id", metavar="RUN_ID", help="the run to cancel (its id or first 8+ characters)"
    )
    cancel.add_argument("--by", help="who cancels, kept on the run's record (default: the OS user)")
    refused.register(actions)


def _producer_options(parser: argparse.ArgumentParser) -> None:
    """The flags of the producer that enqueues a command's task (a replay, a resume)."""
    for flag in PRODUCER_FLAGS:
        option = "--" + flag.replace("_", "-")
        parser.add_argument(option, help=f"default: $TASKLEASE_{flag.upper()}")
    parser.add_argument(
        "--tasks-endpoint",
        help="a local emulator (default: $TASKLEASE_TASKS_ENDPOINT, else Cloud Tasks)",
    )


def run(
    args: argparse.Namespace,
    out: TextIO | None = None,
    err: TextIO | None = None,
    make_store: Callable[[str | None], LeaseStore] = store_from_url,
) -> int:
    """Carry out one ``tasklease runs`` command; return the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    if args.runs_command == "unknown":  # The emulator's log, not the store.
        return refused.run(args, out, err)
    try:
        store = open_existing_store(args.store, make_store, err)
    except (ConfigurationError, StoreUnavailable) as exc:
        return _error(args, err, out, Exit.FAILED, str(exc))
    try:
        operations = Operations(store, lambda: _producer(args))
        if getattr(args, "run_id", None):  # A unique prefix names its run everywhere.
            args.run_id = operations.resolve(args.run_id)
        command = _COMMANDS[args.runs_command]
        return command(operations, args, out, err)
    except AmbiguousRunId as exc:
        return _error(args, err, out, Exit.USAGE, str(exc))
    except ProducerNotConfigured as exc:  # Exit 1, as for a producer that fails.
        return _error(args, err, out, Exit.FAILED, str(exc))
    except OperationRefused as exc:
        return _error(args, err, out, Exit.REFUSED, str(exc))
    except (StoreUnavailable, ConfigurationError) as exc:
        return _error(args, err, out, Exit.FAILED, str(exc))
    except EnqueueError as exc:
        task = "resume" if args.runs_command == "signal" else "replay"
        return _error(args, err, out, Exit.FAILED, f"could not enqueue the {task}: {exc}")
    except SignalError as exc:
        return _error(args, err, out, Exit.USAGE, str(exc))
    except ValueError as exc:  # A cursor this store did not hand out, a bad jobs file.
        return _error(args, err, out, Exit.USAGE, str(exc))
    finally:
        store.close()


def _list(operations: Operations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    now = operations.clock()
    filters = RunFilter(
        status=RunStatus(args.status) if args.status else None,
        handler=args.handler,
        kind=args.kind,
        older_than=now - args.older_than if args.older_than else None,
        newer_than=now - args.newer_than if args.newer_than else None,
        manual=True if args.manual else (False if args.not_manual else None),
    )
    page = operations.list_runs(filters, args.limit, args.cursor)
    if args.json:
        _print_json(out, {"runs": [run_summary(r, now) for r in page.runs], "cursor": page.cursor})
        return Exit.OK
    _table(out, page.runs, now)
    if page.cursor:
        print(f"\nmore: --cursor {page.cursor}", file=out)
    return Exit.OK


def _show(operations: Operations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if (args.run_id is None) == (args.job is None):
        return _error(args, err, out, Exit.USAGE, "give a RUN_ID or --job, not both")
    if args.job is not None:
        found = operations.store.find_runs(job_name=args.job, schedule_time=args.schedule_time)
        record = found[0] if found else None
        wanted = f"{args.job} {args.schedule_time or ''}".strip()
    else:
        record = operations.show(args.run_id)
        wanted = args.run_id
    if record is None:
        return _error(args, err, out, Exit.NOT_FOUND, f"no run {wanted}")
    now = operations.clock()
    summary = run_summary(record, now)
    bodies = redacted_bodies(record.payload, record.result_json) if args.payload else {}
    joins = operations.fan_ins(record.run_id)
    if args.json:
        shown = {**summary, **steps.summary(record), "waits": waits.summary(record)}
        _print_json(out, {**shown, "fan_ins": joins, **bodies})
        return Exit.OK
    for name, value in summary.items():
        if name == "identity":
            for key, item in sorted(value.items()):
                print(_safe(f"{'identity.' + key:<18} {item}"), file=out)
        elif value is not None:
            print(_safe(f"{name:<18} {_describe(name, value, record, now)}"), file=out)
    for line in [*steps.summary_lines(record), *waits.summary_lines(record), *_fan_in_lines(joins)]:
        print(_safe(line), file=out)
    for name in ("payload", "result"):
        if name in bodies:
            text = "(none)" if bodies[name] is None else json.dumps(bodies[name], indent=2)
            lines = [_safe(line) for line in text.splitlines()]
            print(f"{name + ':':<18} " + "\n    ".join(lines), file=out)
    return Exit.OK


def _fan_in_lines(joins: list[dict[str, Any]]) -> list[str]:
    return [line for join in joins for line in fan_in.summary_lines(join)]


def _stuck(operations: Operations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    path, declared = default_schedules(args.schedules), code_schedules(args.router, err)
    schedules = load_schedules(path, declared) if path or declared else None
    report = operations.stuck(schedules, args.grace, args.limit)
    now = operations.clock()
    if args.json:
        _print_json(out, _stuck_json(report, now))
    else:
        if report.runs:
            print("In-progress runs whose lease expired (the attempt crashed or hangs):", file=out)
            _table(out, report.runs, now)
        for job in report.jobs:
            print(_safe(f"job {job.name} ({job.schedule}): {_overdue_text(job)}"), file=out)
        if report.empty:
            checked = f" and {len(schedules)} scheduled jobs" if schedules else ""
            print(f"nothing stuck: no expired lease{checked}", file=out)
    return Exit.OK if report.empty else Exit.STUCK


def _release(operations: Operations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Release the attempt named, or the one read now: never one that took over in between.
    seen = operations.store.get(args.run_id)
    attempt = args.attempt or (seen.attempt_id if seen else None)
    token = seen.fencing_token if seen and not args.attempt else None
    decision = operations.release(
        args.run_id, force=args.force, attempt_id=attempt, fencing_token=token
    )
    outcome = decision.outcome
    until = decision.live_until.isoformat() if decision.live_until else None
    holder = decision.record
    holding = (
        f"attempt {holder.attempt_id} (fencing token {holder.fencing_token})" if holder else ""
    )
    released = outcome is ReleaseOutcome.RELEASED
    if decision.forced:
        print(
            f"warning: released run {args.run_id} while attempt {attempt}'s lease was live "
            f"(until {until}): it may still be running; its renew and finish will be refused",
            file=err,
        )
    code = {
        ReleaseOutcome.RELEASED: Exit.OK,
        ReleaseOutcome.ALREADY_RELEASED: Exit.OK,
        ReleaseOutcome.LEASE_LIVE: Exit.REFUSED,
        ReleaseOutcome.FINISHED: Exit.REFUSED,
        ReleaseOutcome.MISSING: Exit.NOT_FOUND,
        ReleaseOutcome.HOLDER_CHANGED: Exit.REFUSED,
    }[outcome]
    message = {
        ReleaseOutcome.RELEASED: f"released attempt {attempt}: the next delivery runs it",
        ReleaseOutcome.ALREADY_RELEASED: "already released",
        ReleaseOutcome.LEASE_LIVE: f"refused: its lease is live until {until}: {holding} may "
        f"still be running (--force --attempt {attempt} to release it anyway)",
        ReleaseOutcome.FINISHED: "refused: the run waits for a signal and nothing holds it; "
        "send the signal (`runs signal`)"
        if decision.record is not None and decision.record.status is RunStatus.WAITING
        else "refused: the run is finished ("
        + (decision.record.status.value if decision.record else "?")
        + "); replay a failed run instead",
        ReleaseOutcome.MISSING: "no such run",
        ReleaseOutcome.HOLDER_CHANGED: f"refused: attempt {attempt} no longer holds it, "
        f"{holding} does: nothing was released; look again (`runs show`) before releasing",
    }[outcome]
    if args.json:
        record = decision.record
        _print_json(
            out,
            {
                "outcome": outcome.value,
                "forced": decision.forced,
                "live_until": until,
                "released_attempt_id": attempt if released else None,
                "run": None if record is None else run_summary(record, operations.clock()),
            },
        )
    else:
        print(_safe(f"run {args.run_id}: {message}"), file=out if code == Exit.OK else err)
    return code


def _replay(operations: Operations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if operations.store.get(args.run_id) is None:
        return _error(args, err, out, Exit.NOT_FOUND, f"no run {args.run_id}")
    corrected = None
    if args.payload is not None:
        try:
            corrected = json.dumps(json.loads(args.payload.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            return _error(args, err, out, Exit.USAGE, f"--payload {args.payload}: {exc}")
    result = operations.replay(args.run_id, corrected)
    if args.json:
        _print_json(
            out,
            {
                "run_id": result.run_id,
                "replay_run_id": result.replay_run_id,
                "task_name": result.task_name,
                "created": result.created,
                "outcome": result.outcome.value,
                "replayed_run_id": result.replayed_run_id,
                "replay_status": result.replay_status,
                "corrected_payload": corrected is not None,
            },
        )
    else:
        corrected_note = " (with the corrected payload)" if corrected is not None else ""
        print(_safe(f"run {result.run_id}: {result.summary}{corrected_note}"), file=out)
    return Exit.OK


_SIGNALLED = {
    Signalled.RESUMES: "signal recorded; the run resumes",
    Signalled.KEPT: "signal recorded; the run has not reached its wait yet and gets it there",
    Signalled.DUPLICATE: "a signal of this name was sent before; the run resumes once, "
    "with the first one's payload",
    Signalled.TIMED_OUT: "refused: the wait of this name timed out; nothing resumes",
    Signalled.ENDED: "refused: the run has ended; nothing resumes",
}


def _signal(operations: Operations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    payload = None
    if args.payload is not None:
        try:
            text = (
                sys.stdin.read()
                if str(args.payload) == "-"
                else args.payload.read_text(encoding="utf-8")
            )
            payload = json.loads(text)
        except (OSError, ValueError) as exc:
            return _error(args, err, out, Exit.USAGE, f"--payload {args.payload}: {exc}")
    decision = operations.signal(args.run_id, args.name, payload)
    if decision.outcome is Signalled.MISSING:
        return _error(args, err, out, Exit.NOT_FOUND, f"no run {args.run_id}")
    code = Exit.OK if decision.outcome.accepted else Exit.REFUSED
    if args.json:
        _print_json(
            out,
            {
                "run_id": args.run_id,
                "signal": args.name,
                "outcome": decision.outcome.value,
                "accepted": decision.outcome.accepted,
                "resume_enqueued": decision.resume is not None,
            },
        )
    else:
        print(_safe(f"run {args.run_id}: {_SIGNALLED[decision.outcome]}"), file=out)
    return code


def _cancel(operations: Operations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        result = cancel_run(operations.store, args.run_id, args.by, clock=operations.clock)
    except ConfigurationError as exc:  # An empty or overlong --by.
        return _error(args, err, out, Exit.USAGE, str(exc).replace("cancel(by=...)", "--by"))
    if result.outcome is CancelOutcome.MISSING:
        return _error(args, err, out, Exit.NOT_FOUND, f"no run {args.run_id}")
    code = Exit.REFUSED if result.outcome is CancelOutcome.ENDED else Exit.OK
    if args.json:
        record = result.record
        summary = None if record is None else run_summary(record, operations.clock())
        _print_json(
            out, {"outcome": result.outcome.value, "cancelled": result.accepted, "run": summary}
        )
    else:
        print(_safe(f"run {args.run_id}: {result.summary}"), file=out if code == Exit.OK else err)
    return code


_COMMANDS: dict[str, Callable[[Operations, argparse.Namespace, TextIO, TextIO], int]] = {
    "list": _list,
    "show": _show,
    "stuck": _stuck,
    "release": _release,
    "replay": _replay,
    "signal": _signal,
    "cancel": _cancel,
}


def _producer(args: argparse.Namespace) -> Producer:
    overrides = {
        name: getattr(args, name)
        for name in (*PRODUCER_FLAGS, "tasks_endpoint")
        if getattr(args, name, None)
    }
    return Producer.from_env(**overrides)


def _stuck_json(report: StuckReport, now: datetime) -> dict[str, Any]:
    return {
        "runs": [run_summary(r, now) for r in report.runs],
        "jobs": [
            {
                "name": job.name,
                "schedule": job.schedule,
                "due": rfc3339_or_none(job.due),
                "last_success": rfc3339_or_none(job.last_success),
                "last_success_run_id": job.last_success_run_id,
            }
            for job in report.jobs
        ],
    }


def _overdue_text(job: OverdueJob) -> str:
    last = (
        f"last success was the {rfc3339_or_none(job.last_success)} run ({job.last_success_run_id})"
        if job.last_success
        else "no successful run on record"
    )
    return f"the {rfc3339_or_none(job.due)} run has not succeeded; {last}"


def _table(out: TextIO, records: list[RunRecord], now: datetime) -> None:
    if not records:
        print("no runs", file=out)
        return
    rows: list[list[str]] = [["STATUS", "KIND", "HANDLER", "TRIES", "CLAIMED", "NOTE", "RUN ID"]]
    for record in records:
        fields = (
            record.status.value + (" (stuck)" if run_summary(record, now)["stuck"] else ""),
            record.kind,
            record.handler,
            str(record.attempts),
            _ago(now - record.claimed_at),
            _note(record)[:40],
            record.run_id,
        )
        rows.append([_safe(field) for field in fields])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]), file=out)


def _note(record: RunRecord) -> str:
    if record.replayed_as:
        return f"replayed as {record.replayed_as[:12]}"
    if record.replay_of:
        return f"replay of {record.replay_of[:12]}"
    text = record.error or record.identity.get("task_name") or record.identity.get("job_name")
    return (text or "").splitlines()[0] if text else ""


def _describe(name: str, value: Any, record: RunRecord, now: datetime) -> str:
    if name == "lease_expires" and record.status is RunStatus.IN_PROGRESS:
        moment = record.lease_expires
        left = moment - now
        when = f"in {_ago(left)}" if left > timedelta(0) else f"{_ago(-left)} ago"
        return f"{value} ({when})"
    if name == "claimed_at":
        return f"{value} ({_ago(now - record.claimed_at)} ago)"
    return str(value)


def _ago(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(seconds) >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _print_json(out: TextIO, value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True), file=out)


def _safe(text: str) -> str:
    """``text`` as it may reach a terminal: stored strings (error text, names, identity
    fields) come from callers, and their control characters could send escape codes (set a
    title, hide output, write the clipboard) to the operator's terminal."""
    return escape_controls(text)


def _error(args: argparse.Namespace, err: TextIO, out: TextIO, code: Exit, message: str) -> int:
    print(_safe(f"tasklease runs: {message}"), file=err)
    if getattr(args, "json", False):
        _print_json(out, {"error": message, "exit_code": int(code)})
    return code


def _duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value
