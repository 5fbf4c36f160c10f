"""TEMPORARY: a stand-in for the simulation's store factories (memory and SQLite only), so
``tasklease simulate`` can be built and tested before the real module lands. The others
check their environment as the real module does, then refuse."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path

from tasklease import protocol
from tasklease.errors import ConfigurationError
from tasklease.worker.stores.base.store import LeaseStore
from tasklease.worker.stores.memory.store import MemoryStore
from tasklease.worker.stores.sqlite.store import SqliteStore

__all__ = ["STORE_NAMES", "store_factory"]

STORE_NAMES = ("memory", "sqlite", "postgres", "firestore", "spanner")
_NEEDS = {
    "postgres": protocol.ENV_STORE,
    "firestore": "FIRESTORE_EMULATOR_HOST",
    "spanner": "SPANNER_EMULATOR_HOST",
}


def store_factory(name: str, directory: Path) -> Callable[[], LeaseStore]:
    """A zero-argument factory of fresh stores of kind ``name``; SQLite files in ``directory``."""
    if name == "memory":
        return MemoryStore
    if name == "sqlite":
        numbers = itertools.count(1)
        return lambda: SqliteStore(directory / f"simulation-{next(numbers)}.db")
    if name in _NEEDS:
        variable = _NEEDS[name]
        if not os.environ.get(variable):
            raise ConfigurationError(f"the {name} simulation store needs {variable}: set it")
        raise ConfigurationError(f"the {name} simulation store is not in this stand-in")
    raise ConfigurationError(f"unknown store {name!r}: choose one of {', '.join(STORE_NAMES)}")
