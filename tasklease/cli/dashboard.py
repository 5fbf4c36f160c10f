"""``tasklease dashboard``: the operators' web page over a store, on loopback by default."""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from tasklease.cli.code_schedules import add_router_option, code_schedules
from tasklease.cli.common import (
    DEFAULT_DASHBOARD_PORT,
    Subcommands,
    add_command,
    stop_on_sigterm,
    wait,
)
from tasklease.cli.ports import Port, first_clash
from tasklease.cli.store_choice import STORE_HELP, existing_store_url
from tasklease.errors import ConfigurationError
from tasklease.plumbing.loopback import is_loopback_url
from tasklease.plumbing.url_secrets import shown_url
from tasklease.worker.observe.logs import configure_logging

if TYPE_CHECKING:
    from tasklease.jobs import Job

NAME = "dashboard"


def register(commands: Subcommands) -> None:
    board = add_command(commands, NAME, "serve the operators' web page over the store")
    board.add_argument(
        "--store",
        default=None,
        help=STORE_HELP,
    )
    board.add_argument("--host", default="127.0.0.1", help="the address it binds")
    board.add_argument(
        "--port", type=int, default=DEFAULT_DASHBOARD_PORT, help="the port it listens on"
    )
    board.add_argument(
        "--allow-host",
        action="append",
        default=[],
        help="another Host header name to answer, repeatable (default: only loopback names "
        "and --host)",
    )
    board.add_argument(
        "--schedules", type=Path, help="[[job]] tables, for stuck jobs (default: ./tasklease.toml)"
    )
    board.add_argument(
        "--outbox",
        default=None,
        help="the outbox's URL for its page (default: TASKLEASE_OUTBOX_URL, else the store's "
        "database when it has the tasklease_outbox table)",
    )
    add_router_option(board)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    configure_logging()
    if not is_loopback_url(f"http://{args.host}/"):
        print(
            f"warning: the dashboard has no login and listens on {args.host}: anyone who "
            "reaches it can release and replay runs. Prefer 127.0.0.1 and an SSH tunnel, or "
            "mount it in the worker behind OIDC (create_app(..., dashboard='/tasklease')).",
            file=sys.stderr,
        )
    clash = first_clash([Port(args.host, args.port, "the dashboard", "--port")])
    if clash:
        print(f"tasklease dashboard: {clash}", file=sys.stderr)
        return 1
    try:
        store_url = existing_store_url(args.store, sys.stderr)
        declared = code_schedules(args.router)
    except ConfigurationError as exc:
        print(f"tasklease dashboard: {exc}", file=sys.stderr)
        return 1
    stop = stop_on_sigterm()
    serving = serving_dashboard(
        store_url,
        args.host,
        args.port,
        None,
        args.schedules,
        allowed_hosts=args.allow_host,
        declared=declared,
        outbox=args.outbox,
    )
    with serving as url:
        print(f"tasklease dashboard on {url} (store: {shown_url(store_url)})")
        return wait(stop)


@contextmanager
def serving_dashboard(
    store_url: str | None,
    host: str,
    port: int,
    producer_env: dict[str, str] | None,
    schedules: Path | None = None,
    *,
    allowed_hosts: Iterable[str] = (),
    declared: Sequence[Job] = (),
    outbox: str | None = None,
) -> Iterator[str]:
    """The dashboard on ``host:port`` in a thread, for as long as the block runs, answering
    loopback ``Host`` names, ``host`` and ``allowed_hosts`` only. Its stuck jobs are the
    ``declared`` ones (a router's schedules in code) with the ``schedules`` file's over them.
    Its outbox page shows ``outbox``, else the one :func:`tasklease.outbox.locate.outbox_url`
    finds for the store."""
    from werkzeug.serving import make_server  # noqa: PLC0415

    from tasklease.outbox.locate import outbox_url  # noqa: PLC0415
    from tasklease.producer import Producer  # noqa: PLC0415
    from tasklease.worker.dashboard import create_dashboard_app  # noqa: PLC0415
    from tasklease.worker.operate.stuck_schedules import default_schedules, load_schedules  # noqa: PLC0415
    from tasklease.worker.stores import store_from_url  # noqa: PLC0415

    app = create_dashboard_app(
        store_from_url(store_url),
        schedules=(
            load_schedules(path, declared)
            if (path := default_schedules(schedules)) or declared
            else None
        ),
        producer=(lambda: Producer.from_env(producer_env)) if producer_env else None,
        host=host,
        allowed_hosts=allowed_hosts,
        outbox=outbox if outbox is not None else outbox_url(store_url) or "",
    )
    server = make_server(host, port, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="dashboard", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_port}/"
    finally:
        server.shutdown()
        thread.join(timeout=5)
