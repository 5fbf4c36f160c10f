"""``tasklease outbox migrate|relay|status``: the transactional-enqueue outbox of your database.

The outbox URL is ``sqlite:///PATH``, ``postgresql://...``, ``firestore://?project=P`` or
``spanner://projects/P/instances/I/databases/D`` (``--url``, else ``--url-file``, else
``TASKLEASE_OUTBOX_URL``). A URL with a password is refused as ``--url``: every local user
reads a process's command line (``ps``), for as long as the relay runs.
``relay`` creates tasks through the producer's settings (``TASKLEASE_TASKS_ENDPOINT`` for the
local emulator).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tasklease.cli.common import Subcommands, add_command, stop_on_sigterm, wait
from tasklease.plumbing.url_secrets import has_password, scrubbed, shown_url

if TYPE_CHECKING:
    from tasklease.outbox.db import OutboxDB
    from tasklease.outbox.destinations import Destinations
    from tasklease.producer.producer import Producer

NAME = "outbox"
ENV_URL = "TASKLEASE_OUTBOX_URL"


def register(commands: Subcommands) -> None:
    parser = add_command(commands, NAME, "the transactional-enqueue outbox: migrate, relay, status")
    actions = parser.add_subparsers(dest="outbox_command", required=True)
    migrate = add_command(actions, "migrate", "create the tasklease_outbox table")
    _add_url_options(migrate)
    migrate.add_argument(
        "--print",
        dest="print_sql",
        metavar="DIALECT",
        nargs="?",
        const="",
        help="print the SQL instead (for Alembic or Django migrations, or gcloud's --ddl-file): "
        "sqlite, postgresql or spanner, else that of --url (default: off)",
    )
    relay = add_command(actions, "relay", "send pending entries to Cloud Tasks")
    _add_url_options(relay)
    relay.add_argument("--follow", action="store_true", help="keep relaying until Ctrl-C")
    relay.add_argument("--poll", type=float, default=1.0, help="seconds between sweeps")
    relay.add_argument(
        "--lease", type=float, default=60.0, help="seconds a claim keeps entries from other relays"
    )
    relay.add_argument("--requeue-failed", action="store_true", help="retry failed entries")
    status = add_command(actions, "status", "depth, oldest age, failed entries and why")
    _add_url_options(status)


def _add_url_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--url", help=f"the database, without a password (default: ${ENV_URL})")
    command.add_argument(
        "--url-file",
        type=Path,
        metavar="PATH",
        help="a file holding the database's URL, for one with a password (default: none)",
    )


def _url(args: argparse.Namespace) -> str | None:
    """The outbox URL the options name; None (said on stderr) when none or refused."""
    if args.url and has_password(args.url):
        print(
            f"tasklease outbox: --url {shown_url(args.url)} carries a password, which every "
            f"local user can read in the process list: set {ENV_URL} or give --url-file PATH",
            file=sys.stderr,
        )
        return None
    url: str | None = args.url
    if not url and args.url_file is not None:
        try:
            url = args.url_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            print(f"tasklease outbox: --url-file {args.url_file}: {exc.strerror}", file=sys.stderr)
            return None
        if not url:
            print(f"tasklease outbox: --url-file {args.url_file} is empty", file=sys.stderr)
            return None
    url = url or os.environ.get(ENV_URL)
    if not url:
        print(
            f"tasklease outbox: give --url URL, --url-file PATH or set {ENV_URL}", file=sys.stderr
        )
    return url


def _same_url(args: argparse.Namespace) -> str:
    """The option that named the outbox, to repeat in a command to run next."""
    if args.url:
        return f" --url {args.url}"
    return f" --url-file {args.url_file}" if args.url_file is not None else ""


def run(args: argparse.Namespace) -> int:
    from tasklease.outbox import ddl  # noqa: PLC0415 - keeps `tasklease --help` light.
    from tasklease.outbox.db import open_outbox  # noqa: PLC0415

    if args.outbox_command == "migrate" and args.print_sql:
        try:
            print(ddl.script(args.print_sql), end="")
        except ValueError as exc:
            print(f"tasklease outbox: {exc}", file=sys.stderr)
            return 2
        return 0
    url = _url(args)
    if url is None:
        return 2
    relaying = _relaying() if args.outbox_command == "relay" else None
    if args.outbox_command == "relay" and relaying is None:
        return 2
    if (
        args.outbox_command != "migrate"
        and url.startswith("sqlite:///")
        and not Path(url[len("sqlite:///") :]).is_file()
    ):
        print(f"tasklease outbox: no database file at {shown_url(url)}", file=sys.stderr)
        return 2
    try:
        db = open_outbox(url)
    except ValueError as exc:
        print(f"tasklease outbox: {scrubbed(str(exc), url)}", file=sys.stderr)
        return 2
    except Exception as exc:  # The driver's own words: unreachable, refused, no such folder.
        reason = scrubbed(str(exc), url)
        print(
            f"tasklease outbox: cannot open the outbox at {shown_url(url)}: {reason}",
            file=sys.stderr,
        )
        return 2
    try:
        if args.outbox_command == "migrate":
            if args.print_sql == "":
                print(ddl.script(db.dialect), end="")
                return 0
            db.migrate()
            print(f"tasklease_outbox ready in {shown_url(url)}")
            return 0
        if not db.has_outbox():
            print(
                f"tasklease outbox: no tasklease_outbox table in {shown_url(url)}: create it "
                f"with tasklease outbox migrate{_same_url(args)}",
                file=sys.stderr,
            )
            return 2
        if relaying is not None:
            return _relay(db, args, *relaying)
        return _status(db)
    finally:
        db.close()


def _relaying() -> tuple[Producer, Destinations] | None:
    """The relay's producer and where it may send, from the environment; None (after one
    line saying what to set) when they are missing or refused: the relay does not start."""
    from tasklease.outbox.destinations import for_producer  # noqa: PLC0415
    from tasklease.outbox.sweeper import relay_producer  # noqa: PLC0415

    try:
        producer = relay_producer()
        return producer, for_producer(producer)
    except ValueError as exc:  # NoWorkerURL, or a setting that is refused.
        print(f"tasklease outbox relay: {exc}", file=sys.stderr)
        return None


def _relay(
    db: OutboxDB, args: argparse.Namespace, producer: Producer, destinations: Destinations
) -> int:
    from tasklease.outbox.relay import Relay  # noqa: PLC0415

    if args.requeue_failed:
        print(f"{db.requeue_failed()} failed entries pending again")
    relay = Relay(db, producer, lease=args.lease, destinations=destinations)
    if args.follow:
        stop = stop_on_sigterm()
        thread = threading.Thread(target=relay.follow, args=(args.poll,), daemon=True)
        thread.start()
        print("relaying until Ctrl-C", flush=True)
        code = wait(stop)
        relay.stop()
        thread.join(timeout=args.poll + 10)
        return code
    done = relay.drain()
    print(f"sent {done.sent}, failed {done.failed}, backing off {done.retrying}")
    return 0 if done.retrying == 0 else 1


def _status(db: OutboxDB) -> int:
    status = db.status(time.time())
    print(
        f"pending {status.depth} (oldest {status.oldest_age:.1f} s, backing off "
        f"{status.retrying}), sent {status.sent}, failed {len(status.failed)}"
    )
    for failed in status.failed:
        tries = f"{failed.task_name}, {failed.attempts} tries"
        print(f"  failed {failed.id} ({tries}): {failed.reason}")
    return 0 if not status.failed else 1
