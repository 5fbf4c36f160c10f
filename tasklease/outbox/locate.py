"""Where the outbox of a deployment is: ``TASKLEASE_OUTBOX_URL``, else the store's own
database when it has a ``tasklease_outbox`` table (``tasklease dev``, the dashboard)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from tasklease.outbox.entries import TABLE

ENV_OUTBOX_URL = "TASKLEASE_OUTBOX_URL"


def outbox_url(store_url: str | None) -> str | None:
    """The outbox's URL for the store at ``store_url``, or None when there is none."""
    url = os.environ.get(ENV_OUTBOX_URL)
    if url:
        return url
    if store_url is None:
        return None
    if store_url.startswith("sqlite:///"):
        return store_url if sqlite_has_outbox(Path(store_url[len("sqlite:///") :])) else None
    if store_url.startswith("spanner://"):
        # The store's own options (table=, call_timeout=) are not the outbox's.
        store_url = store_url.split("?", 1)[0]
    elif not store_url.startswith(("postgresql://", "postgres://")):
        return None
    from tasklease.outbox.db import open_outbox  # noqa: PLC0415 - the driver, on use only.

    try:
        db = open_outbox(store_url)
    except Exception:  # Not reachable, not a database we can read: no outbox.
        return None
    try:
        return store_url if db.has_outbox() else None
    finally:
        db.close()


def sqlite_has_outbox(path: Path) -> bool:
    """Read-only, and only if the file exists: the store creates it, with its own mode."""
    if not path.is_file():
        return False
    try:
        with contextlib.closing(
            sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        ) as c:
            query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
            return c.execute(query, (TABLE,)).fetchone() is not None
    except sqlite3.Error:
        return False
