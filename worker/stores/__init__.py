"""Lease stores: the contract and its backends, and the store URL that picks one."""

from __future__ import annotations

import os

from worker import constants as c
from worker.errors import ConfigurationError
from worker.stores.base import LeaseStore
from worker.stores.memory import MemoryStore
from worker.stores.sqlite import SqliteStore

__all__ = ["LeaseStore", "MemoryStore", "SqliteStore", "store_from_url"]


def store_from_url(url: str | None = None) -> LeaseStore:
    """Build a store from a URL, or from ``TASKLEASE_STORE`` (default: a SQLite file).

    - ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``
    - ``memory://``
    """
    url = url or os.environ.get(c.ENV_STORE) or c.DEFAULT_STORE_URL
    scheme, _, rest = url.partition("://")
    if scheme == "memory":
        return MemoryStore()
    if scheme == "sqlite":
        path = rest[1:] if rest.startswith("/") else rest
        if not path:
            raise ConfigurationError(f"store URL {url!r} names no file: use sqlite:///runs.db")
        return SqliteStore(path)
    raise ConfigurationError(f"unknown store URL {url!r}: use sqlite:///path or memory://")
