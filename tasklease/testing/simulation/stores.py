"""Fresh, empty stores of each kind for a simulation (``tasklease simulate --store NAME``).

A simulation passes its virtual clock to every store call, so each store is set up to decide
by that clock alone:

- memory, SQLite: every rule reads the clock given. SQLite purges expired records now and
  then (every ``purge_interval`` of ``time.monotonic``) as of the time of the claim that
  triggers it: the virtual time.
- Postgres: ``server_clock`` off (on, a call given a clock decides by the server's instead),
  and no background purge (it purges as of the server's real time, which would delete the
  records of virtual runs kept past their virtual now; the virtual clock may be far from the
  real one). Group commit off: a simulation's calls come one at a time from one thread.
- Firestore and Spanner: every rule reads the clock given. Their TTL (row deletion) policies
  delete by real time on Google's servers; the emulators do not run them. Only the
  emulators are used: a simulation creates a database (Spanner) or collection (Firestore)
  per store.

What is real time still: each store's bounds on a call (timeouts, Postgres' watchdog), the
pauses between a transaction's tries on contention (Firestore, Spanner), and the
background give-back of a claim whose write may have landed unseen (Firestore, Postgres,
Spanner; it gives the claim back as of the claim's own time). None of them compares a lease
with the clock.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import uuid
from collections.abc import Callable
from contextlib import suppress
from datetime import timedelta
from pathlib import Path
from typing import Any

from tasklease import protocol
from tasklease.errors import ConfigurationError
from tasklease.plumbing.url_secrets import POSTGRES_SCHEMES, shown_url
from tasklease.worker.stores.base.store import LeaseStore
from tasklease.worker.stores.memory.store import MemoryStore

__all__ = ["SIMULATION_PROJECT", "SPANNER_INSTANCE", "STORE_NAMES", "store_factory"]

STORE_NAMES = ("memory", "sqlite", "postgres", "firestore", "spanner")
# The Google Cloud project on the emulators when GOOGLE_CLOUD_PROJECT names none, and the
# Spanner emulator's instance the simulation's databases go in (created when missing).
SIMULATION_PROJECT = "tasklease-simulation"
SPANNER_INSTANCE = "tasklease-simulation"
FIRESTORE_EMULATOR = "FIRESTORE_EMULATOR_HOST"
SPANNER_EMULATOR = "SPANNER_EMULATOR_HOST"
# Longer than any simulation: the Postgres store's background purge never starts.
_NO_BACKGROUND_PURGE = timedelta(days=36_500)
_ADMIN_TIMEOUT = 60.0  # Seconds to create a Spanner instance or database on the emulator.

StoreFactory = Callable[[], LeaseStore]


def store_factory(name: str, directory: Path) -> StoreFactory:
    """A zero-argument factory of fresh, empty stores of kind ``name`` (one of
    :data:`STORE_NAMES`), each for one simulation. SQLite files go in ``directory``.

    What a kind needs from the environment is checked here, before any simulation runs:
    postgres a Postgres URL in ``TASKLEASE_STORE`` (each store a schema of its own in that
    database); firestore and spanner their emulator (``FIRESTORE_EMULATOR_HOST``,
    ``SPANNER_EMULATOR_HOST``; project ``GOOGLE_CLOUD_PROJECT``, else
    :data:`SIMULATION_PROJECT`), each store a collection (Firestore) or database (Spanner) of
    its own. ConfigurationError (a ValueError) names what is missing and how to start it.
    Nothing is dropped afterwards: the emulators forget on restart; on Postgres, drop the
    ``tasklease_sim_*`` schemas when done.
    """
    if name == "memory":
        return MemoryStore
    if name == "sqlite":
        return _sqlite_stores(directory)
    if name == "postgres":
        return _postgres_stores(_postgres_url())
    if name == "firestore":
        _emulator(FIRESTORE_EMULATOR, "gcloud emulators firestore start --host-port=HOST:PORT")
        return _firestore_stores(_project())
    if name == "spanner":
        _emulator(SPANNER_EMULATOR, "gcloud emulators spanner start --host-port=HOST:PORT")
        return _spanner_stores(_project())
    raise ConfigurationError(f"unknown store {name!r}: choose one of {', '.join(STORE_NAMES)}")


def _sqlite_stores(directory: Path) -> StoreFactory:
    from tasklease.worker.stores.sqlite.store import SqliteStore  # noqa: PLC0415 - on use only.

    numbers = itertools.count(1)

    def fresh() -> LeaseStore:
        while True:  # A file no earlier simulation used, nor left companions of.
            path = directory / f"simulation-{next(numbers)}.db"
            if not any(Path(f"{path}{suffix}").exists() for suffix in ("", "-wal", "-shm")):
                return SqliteStore(path)

    return fresh


def _postgres_url() -> str:
    url = os.environ.get(protocol.ENV_STORE, "")
    if url.partition("://")[0] in POSTGRES_SCHEMES:
        return url
    found = f"it is {shown_url(url)!r}" if url else "it is not set"
    raise ConfigurationError(
        f"the postgres simulation store needs {protocol.ENV_STORE}=postgresql://USER@HOST:PORT/DB "
        f"({found}): a database where it may create a schema per simulation. Start a "
        "server, e.g. `pg_ctlcluster 15 main start` (Debian's postgresql package)."
    )


def _postgres_stores(url: str) -> StoreFactory:
    try:
        from tasklease.worker.stores.postgres.options import Options  # noqa: PLC0415 - extra.
        from tasklease.worker.stores.postgres.store import PostgresStore  # noqa: PLC0415 - extra.
    except ImportError as exc:
        raise ConfigurationError(
            "the Postgres store needs psycopg 3 and psycopg_pool: pip install 'tasklease[postgres]'"
        ) from exc
    conninfo, options = Options.from_url(url)

    def fresh() -> LeaseStore:
        simulated = dataclasses.replace(
            options,
            schema=f"tasklease_sim_{uuid.uuid4().hex[:12]}",
            server_clock=False,
            purge_interval=_NO_BACKGROUND_PURGE,
            group_commit=False,
        )
        return PostgresStore(conninfo, simulated)

    return fresh


def _emulator(variable: str, command: str) -> None:
    if not os.environ.get(variable):
        raise ConfigurationError(
            f"the simulation runs on Google's emulator only: set {variable}=HOST:PORT of a "
            f"running one (start it: `{command}`)"
        )


def _project() -> str:
    return os.environ.get("GOOGLE_CLOUD_PROJECT") or SIMULATION_PROJECT


def _firestore_stores(project: str) -> StoreFactory:
    from tasklease.worker.stores import store_from_url  # noqa: PLC0415 - on use only.

    def fresh() -> LeaseStore:
        collection = f"tasklease_sim_{uuid.uuid4().hex[:12]}"
        # The URL's way names the extra to install when google-cloud-firestore is missing.
        return store_from_url(f"firestore://?collection={collection}&project={project}")

    return fresh


def _spanner_stores(project: str) -> StoreFactory:
    from tasklease.worker.stores import store_from_url  # noqa: PLC0415 - on use only.

    def fresh() -> LeaseStore:
        path = _new_spanner_database(project)
        return store_from_url(f"spanner://{path}")

    return fresh


def _new_spanner_database(project: str) -> str:
    """A new, empty database on the emulator (in :data:`SPANNER_INSTANCE`, made if
    missing): its path, ``projects/P/instances/I/databases/D``."""
    try:
        from google.api_core import exceptions as api  # noqa: PLC0415 - the optional extra.
        from google.cloud import spanner  # noqa: PLC0415 - the optional extra.
    except ImportError as exc:
        raise ConfigurationError(
            "the Spanner store needs google-cloud-spanner: pip install 'tasklease[spanner]'"
        ) from exc
    client = spanner.Client(project=project)
    try:
        config = f"projects/{project}/instanceConfigs/emulator-config"
        instance: Any = client.instance(  # type: ignore[no-untyped-call]
            SPANNER_INSTANCE, configuration_name=config, node_count=1
        )
        if not instance.exists():
            with suppress(api.AlreadyExists):  # Another simulation made it meanwhile.
                instance.create().result(_ADMIN_TIMEOUT)
        database_id = f"sim-{uuid.uuid4().hex[:12]}"
        instance.database(database_id).create().result(_ADMIN_TIMEOUT)
    finally:
        client.instance_admin_api.transport.close()
        client.database_admin_api.transport.close()
    return f"projects/{project}/instances/{SPANNER_INSTANCE}/databases/{database_id}"
