"""``tasklease locks``: list the locks of exclusive jobs and concurrency keys, and free one.

Next to ``tasklease runs`` and with its conventions: ``--store`` (default
``$TASKLEASE_STORE``), tables for people, ``--json`` for programs, and its exit codes
(:class:`tasklease.cli.runs.Exit`): 0 done, 1 the store failed, 2 bad usage, 3 no such lock,
4 refused (the holder is running: ``--force``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from tasklease.cli.common import Subcommands, add_command
from tasklease.cli.runs import Exit
from tasklease.cli.store_choice import STORE_HELP, open_existing_store
from tasklease.errors import ConfigurationError, StoreUnavailable
from tasklease.protocol import rfc3339_or_none
from tasklease.worker.core.locking import LockReleaseOutcome, LockState, OperatorLockRelease
from tasklease.worker.observe.logs import escape_controls
from tasklease.worker.operate.operations import Operations, lock_summary
from tasklease.worker.stores import LeaseStore, store_from_url

NAME = "locks"
_STATES = {
    LockState.HELD: "held",
    LockState.SILENT: "held (silent)",
    LockState.GAP: "min_gap",
    LockState.FREE: "free",
}


def register(commands: Subcommands) -> None:
    """Add ``locks`` and its subcommands to the ``tasklease`` parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        default=None,
        help=STORE_HELP,
    )
    common.add_argument("--json", action="store_true", help="print JSON for programs")
    locks = add_command(
        commands, NAME, "inspect and free the locks of exclusive jobs and concurrency keys"
    )
    actions = locks.add_subparsers(dest="locks_command", required=True)
    listing = add_command(actions, "list", "locks, latest start first", parents=[common])
    listing.add_argument("--limit", type=_positive, default=100, help="locks listed at most")
    release = add_command(
        actions, "release", "free a lock so the next run takes it", parents=[common]
    )
    release.add_argument("name", metavar="KEY", help="the lock's name, as `locks list` shows it")
    release.add_argument(
        "--force",
        action="store_true",
        help="even while its holder is running (the holder then loses its lease)",
    )


def run(
    args: argparse.Namespace,
    out: TextIO | None = None,
    err: TextIO | None = None,
    make_store: Callable[[str | None], LeaseStore] = store_from_url,
) -> int:
    """Carry out one ``tasklease locks`` command; return the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        store = open_existing_store(args.store, make_store, err)
    except (ConfigurationError, StoreUnavailable) as exc:
        return _error(args, err, out, Exit.FAILED, str(exc))
    try:
        operations = Operations(store)
        if args.locks_command == "list":
            return _list(operations, args, out)
        return _release(operations, args, out, err)
    except (StoreUnavailable, ConfigurationError) as exc:
        return _error(args, err, out, Exit.FAILED, str(exc))
    finally:
        store.close()


def _list(operations: Operations, args: argparse.Namespace, out: TextIO) -> int:
    views = operations.locks(args.limit)
    if args.json:
        _print_json(out, {"locks": [lock_summary(view) for view in views]})
        return Exit.OK
    if not views:
        print("no locks", file=out)
        return Exit.OK
    now = operations.clock()
    rows = [("STATE", "UNTIL", "HOLDER RUN", "STARTED", "TOKEN", "NAME")]
    for view in views:
        lock = view.lock
        rows.append(
            (
                _STATES[view.state],
                "" if view.busy_until is None else f"in {_span(view.busy_until - now)}",
                _clean(lock.holder_run_id[:16]),
                f"{_span(now - lock.started_at)} ago",
                str(lock.fencing_token),
                _clean(lock.name),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]), file=out)
    return Exit.OK


def _release(operations: Operations, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    decision = operations.release_lock(args.name, force=args.force)
    name = _clean(args.name)
    outcome = decision.outcome
    until = rfc3339_or_none(decision.live_until)
    holder = _holder(decision)
    if decision.forced:
        print(
            f"warning: released lock {name} while its holder ({holder}) was running, its lease "
            f"live until {until}: it may still be working; its renewals are now refused, so it "
            "loses its lease (ctx.lease_lost) at its next renewal",
            file=err,
        )
    code = {
        LockReleaseOutcome.RELEASED: Exit.OK,
        LockReleaseOutcome.ALREADY_FREE: Exit.OK,
        LockReleaseOutcome.HOLDER_LIVE: Exit.REFUSED,
        LockReleaseOutcome.MISSING: Exit.NOT_FOUND,
    }[outcome]
    message = {
        LockReleaseOutcome.RELEASED: "released: the next run takes it",
        LockReleaseOutcome.ALREADY_FREE: "already free: nothing keeps the next run out",
        LockReleaseOutcome.HOLDER_LIVE: f"refused: its holder ({holder}) is running, its lease "
        f"live until {until}; --force releases it anyway, and the holder then loses its lease",
        LockReleaseOutcome.MISSING: "no such lock (never taken, or purged once it lapsed)",
    }[outcome]
    if args.json:
        _print_json(
            out,
            {
                "outcome": outcome.value,
                "forced": decision.forced,
                "live_until": until,
                "lock": None
                if decision.lock is None
                else lock_summary(operations.lock_view(decision.lock, operations.clock())),
            },
        )
    else:
        print(f"lock {name}: {message}", file=out if code == Exit.OK else err)
    return code


def _holder(decision: OperatorLockRelease) -> str:
    lock = decision.lock
    if lock is None:
        return "none"
    return _clean(f"run {lock.holder_run_id}, attempt {lock.holder_attempt_id}")


def _clean(text: str) -> str:
    """Lock names carry concurrency keys from payloads: no terminal escapes reach the screen."""
    return escape_controls(text)


def _span(delta: Any) -> str:
    seconds = max(0, int(delta.total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _print_json(out: TextIO, value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True), file=out)


def _error(args: argparse.Namespace, err: TextIO, out: TextIO, code: Exit, message: str) -> int:
    print(f"tasklease locks: {escape_controls(message)}", file=err)
    if getattr(args, "json", False):
        _print_json(out, {"error": message, "exit_code": int(code)})
    return code


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value
