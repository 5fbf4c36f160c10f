"""``tasklease runs unknown``: deliveries the worker refused (404) for a handler name it does
not serve, a misspelled name in ``enqueue`` or a job's URL, and which no run record shows.

The local emulator logs every attempt it sends, so this reads its database (``tasklease
dev``'s ``--data-dir``), read-only. On Cloud Run the same refusals are the WARNING log lines
with ``status=404`` (they carry ``known_handlers``) and the ``tasklease.deliveries`` metric's
``handler="(unknown)"`` series.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

from tasklease.cli.common import Subcommands, add_command

DATA_DIR = Path(".tasklease/emulator")


def register(actions: Subcommands) -> None:
    unknown = add_command(
        actions, "unknown", "deliveries refused for a handler name the worker does not serve"
    )
    unknown.add_argument(
        "--data-dir",
        type=Path,
        default=DATA_DIR,
        help="the emulator's data directory, as tasklease dev --data-dir names it",
    )
    unknown.add_argument("--json", action="store_true", help="print JSON for programs")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """List the refused handler paths, most refused first; 1 when there is no emulator log."""
    path = args.data_dir / "emulator.db"
    if not path.exists():
        print(
            f"tasklease runs: no emulator log at {path}: this reads the local emulator's "
            "(tasklease dev); on Cloud Run look for WARNING lines with status=404",
            file=err,
        )
        return 1
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        rows = connection.execute(
            "SELECT url, COUNT(*), MAX(started_us) FROM deliveries WHERE status = 404 "
            "GROUP BY url ORDER BY COUNT(*) DESC, url"
        ).fetchall()
    refused = [
        {
            "path": urlsplit(url).path,
            "refused": count,
            "last": datetime.fromtimestamp(last / 1e6, UTC).isoformat().replace("+00:00", "Z"),
        }
        for url, count, last in rows
    ]
    if args.json:
        print(json.dumps({"unknown": refused}, indent=2, sort_keys=True), file=out)
    elif not refused:
        print("no delivery was refused for an unknown handler", file=out)
    else:
        width = max(len("PATH"), *(len(row["path"]) for row in refused))
        print(f"{'PATH':<{width}}  REFUSED  LAST", file=out)
        for row in refused:
            print(f"{row['path']:<{width}}  {row['refused']:<7}  {row['last']}", file=out)
    return 0
