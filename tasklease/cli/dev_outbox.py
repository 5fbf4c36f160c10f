"""The outbox relay inside ``tasklease dev``: for ``TASKLEASE_OUTBOX_URL``, else the store's
own database when it has a ``tasklease_outbox`` table."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path

_log = logging.getLogger("tasklease.dev")


def outbox_url(store_url: str) -> str | None:
    from tasklease.outbox.db import open_outbox  # noqa: PLC0415 - only when dev starts.

    url = os.environ.get("TASKLEASE_OUTBOX_URL")
    if url:
        return url
    if store_url.startswith("sqlite:///"):
        return store_url if _sqlite_has_outbox(Path(store_url[len("sqlite:///") :])) else None
    if not store_url.startswith(("postgresql://", "postgres://")):
        return None
    try:
        db = open_outbox(store_url)
    except Exception:  # Not reachable, not a database we can read: no relay.
        return None
    try:
        return store_url if db.has_outbox() else None
    finally:
        db.close()


def _sqlite_has_outbox(path: Path) -> bool:
    """Read-only, and only if the file exists: the store creates it, with its own mode."""
    if not path.is_file():
        return False
    try:
        with contextlib.closing(
            sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        ) as c:
            query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tasklease_outbox'"
            return c.execute(query).fetchone() is not None
    except sqlite3.Error:
        return False


@contextlib.contextmanager
def dev_relay(store_url: str, env: Mapping[str, str]) -> Iterator[str | None]:
    """A following relay (the fast path, then polls) through the emulator while dev runs."""
    url = outbox_url(store_url)
    if url is None:
        yield None
        return
    from tasklease.outbox.sweeper import RelayThread, relay_producer  # noqa: PLC0415

    with RelayThread(url, relay_producer(env), poll=0.5):
        _log.info("outbox relay for %s", url)
        yield url
