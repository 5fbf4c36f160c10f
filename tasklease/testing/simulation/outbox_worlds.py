"""The database the outbox workload runs on, per kind of store: the relay's outbox (the real
one tasklease has for that database) and the users' own transactions on it.

- SQLite: the store's file; a user's transaction is a ``sqlite3`` connection to it.
- Postgres: the store's schema; a user's transaction is a ``psycopg`` connection's.
- Firestore: staging writes to the fixed collection ``tasklease_outbox``, so each simulation
  has a Google Cloud project of its own on the emulator (no run sees another's entries); a
  user's transaction is a ``@firestore.transactional`` one.
- Spanner: the store's database; a user's transaction is ``database.run_in_transaction``'s.

Each user's transaction writes its own row (in ``sim_orders``) and stages one enqueue, then
commits or rolls back. The store's kind is told from its class without importing any
optional backend: a store is an instance of its class only once that module was imported.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from tasklease.outbox.base import OutboxDB, Status
from tasklease.outbox.db import SQLiteOutbox
from tasklease.outbox.entries import Entry, Undecodable
from tasklease.producer import Producer
from tasklease.producer.results import EnqueueResult
from tasklease.testing.simulation.engine import Engine
from tasklease.worker.stores.base.store import LeaseStore

__all__ = [
    "OUTBOX_HANDLER",
    "OutboxWorld",
    "PausedOutbox",
    "outbox_kind",
    "outbox_world",
]

OUTBOX_HANDLER = "outboxed"

# (module, class, kind): the stores whose database has an outbox tasklease relays.
_STORE_CLASSES = (
    ("tasklease.worker.stores.sqlite.store", "SqliteStore", "sqlite"),
    ("tasklease.worker.stores.postgres.store", "PostgresStore", "postgres"),
    ("tasklease.worker.stores.firestore.store", "FirestoreStore", "firestore"),
    ("tasklease.worker.stores.spanner.store", "SpannerStore", "spanner"),
)


class OutboxWorld(Protocol):
    """One simulation's outbox database: the relay's outbox and the users' transactions."""

    @property
    def outbox(self) -> OutboxDB:
        """The relay's outbox, its claims and marks pausing the calling actor."""
        ...

    def user_transaction(self, key: str, commit: bool) -> EnqueueResult:
        """A user's transaction: its own row and one staged enqueue (``key``), then commit
        or roll back; the producer's answer to the enqueue."""
        ...

    def close(self) -> None: ...


class PausedOutbox(OutboxDB):
    """``inner``, each claim and mark a round trip: the relay's actor pauses after a claim
    and before a mark, where a kill lands between claiming an entry and creating its task."""

    def __init__(self, inner: OutboxDB, engine: Engine, rng: random.Random) -> None:
        self.inner, self.engine, self.rng = inner, engine, rng
        self.dialect = inner.dialect

    def claim(self, limit: int, now: float, lease: float) -> list[Entry | Undecodable]:
        claimed = self.inner.claim(limit, now, lease)
        self.engine.pause(self.rng.uniform(0.001, 0.02))
        return claimed

    def mark_sent(self, ids: Sequence[str], now: float) -> None:
        self.engine.pause(self.rng.uniform(0.001, 0.02))
        self.inner.mark_sent(ids, now)

    def close(self) -> None:
        self.inner.close()

    def wait(self, timeout: float) -> bool:
        return self.inner.wait(timeout)

    def migrate(self) -> None:
        self.inner.migrate()

    def has_outbox(self) -> bool:
        return self.inner.has_outbox()

    def mark_failed(self, failures: Mapping[str, str]) -> None:
        self.inner.mark_failed(failures)

    def retry_later(self, retries: Mapping[str, tuple[float, str]]) -> None:
        self.inner.retry_later(retries)

    def requeue_failed(self) -> int:
        return self.inner.requeue_failed()

    def purge_sent(self, before: float, limit: int | None = None) -> int:
        return self.inner.purge_sent(before, limit)

    def pending(self, now: float) -> tuple[int, float]:
        return self.inner.pending(now)

    def status(self, now: float, failed_limit: int = 50) -> Status:
        return self.inner.status(now, failed_limit)


def outbox_kind(store: LeaseStore) -> str | None:
    """The kind of ``store`` (its subclasses' too) the outbox workload runs on, else None."""
    for module, name, kind in _STORE_CLASSES:
        store_class = getattr(sys.modules.get(module), name, None)
        if store_class is not None and isinstance(store, store_class):
            return kind
    return None


def outbox_world(
    store: LeaseStore, engine: Engine, rng: random.Random, producer: Producer
) -> OutboxWorld | None:
    """The outbox world of ``store``'s database, its outbox migrated and the users' table
    made (None for a store without one; see :func:`outbox_kind`)."""
    kind = outbox_kind(store)

    def stage(key: str, transaction: Any) -> EnqueueResult:
        return producer.enqueue(OUTBOX_HANDLER, {"steps": 1}, key=key, transaction=transaction)

    def paused(db: OutboxDB) -> OutboxDB:
        return PausedOutbox(db, engine, rng)

    # Each store's module is loaded already (``store`` is an instance of its class).
    if kind == "sqlite":
        from tasklease.worker.stores.sqlite.store import SqliteStore  # noqa: PLC0415

        assert isinstance(store, SqliteStore)
        return _SQLiteWorld(str(store.path), stage, paused)
    if kind == "postgres":
        from tasklease.worker.stores.postgres.store import PostgresStore  # noqa: PLC0415

        assert isinstance(store, PostgresStore)
        return _PostgresWorld(store.connections.conninfo, store.options.schema, stage, paused)
    if kind == "firestore":
        return _FirestoreWorld(stage, paused)
    if kind == "spanner":
        from tasklease.worker.stores.spanner.store import SpannerStore  # noqa: PLC0415

        assert isinstance(store, SpannerStore)
        return _SpannerWorld(store.database_path, stage, paused)
    return None


_Stage = Callable[[str, Any], EnqueueResult]  # (key, the user's transaction) -> the answer.
_Pause = Callable[[OutboxDB], OutboxDB]  # The relay's outbox -> the same, its calls pausing.


class _RolledBack(Exception):
    """Raised in a user's transaction function to roll it back (Firestore, Spanner)."""


class _SQLiteWorld:
    """The store's file: the relay's :class:`~tasklease.outbox.db.SQLiteOutbox` on it, and a
    user's ``sqlite3`` connection per transaction."""

    def __init__(self, path: str, stage: _Stage, paused: _Pause) -> None:
        self.path, self.stage = path, stage
        self.db = SQLiteOutbox(path)
        self.outbox = paused(self.db)
        self.db.migrate()
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as connection:
            connection.execute("CREATE TABLE IF NOT EXISTS sim_orders (key TEXT PRIMARY KEY)")

    def user_transaction(self, key: str, commit: bool) -> EnqueueResult:
        connection = sqlite3.connect(self.path, isolation_level=None)
        try:
            connection.execute("BEGIN")
            result = self.stage(key, connection)
            connection.execute("INSERT INTO sim_orders (key) VALUES (?)", (key,))
            if commit:
                connection.commit()
            else:
                connection.rollback()
        finally:
            connection.close()
        return result

    def close(self) -> None:
        self.db.close()


class _PostgresWorld:
    """The store's schema: the relay's :class:`~tasklease.outbox.db.PostgresOutbox` on it
    (``?schema=``), and one user's connection, not in autocommit mode."""

    def __init__(self, conninfo: str, schema: str, stage: _Stage, paused: _Pause) -> None:
        import psycopg  # noqa: PLC0415 - the postgres extra, as the store is one.
        from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

        from tasklease.outbox.db import PostgresOutbox  # noqa: PLC0415

        self.stage = stage
        # The outbox takes a URL, its schema a query option; libpq reads every keyword so.
        params = {**conninfo_to_dict(conninfo), "schema": schema}
        self.db = PostgresOutbox("postgresql://?" + urlencode(params, quote_via=quote))
        self.outbox = paused(self.db)
        self.db.migrate()
        self.connection = psycopg.connect(conninfo, autocommit=True)
        self.connection.execute(f'SET search_path TO "{schema}"')
        self.connection.execute("CREATE TABLE IF NOT EXISTS sim_orders (key TEXT PRIMARY KEY)")
        self.connection.autocommit = False

    def user_transaction(self, key: str, commit: bool) -> EnqueueResult:
        connection = self.connection
        try:
            result = self.stage(key, connection)
            connection.execute("INSERT INTO sim_orders (key) VALUES (%s)", (key,))
        except BaseException:
            connection.rollback()
            raise
        if commit:
            connection.commit()
        else:
            connection.rollback()
        return result

    def close(self) -> None:
        self.db.close()
        self.connection.close()


class _FirestoreWorld:
    """A project of this simulation's own on the emulator (staging's collection is fixed):
    the relay's :class:`~tasklease.outbox.firestore_db.FirestoreOutbox` and the users'
    client on it."""

    def __init__(self, stage: _Stage, paused: _Pause) -> None:
        from google.cloud import firestore  # noqa: PLC0415 - the firestore extra.

        from tasklease.outbox.firestore_db import FirestoreOutbox  # noqa: PLC0415

        project = f"tasklease-sim-{uuid.uuid4().hex[:12]}"
        self.stage, self.firestore = stage, firestore
        self.db = FirestoreOutbox(project=project)
        self.outbox = paused(self.db)
        self.client = firestore.Client(project=project)

    def user_transaction(self, key: str, commit: bool) -> EnqueueResult:
        results: list[EnqueueResult] = []

        def work(transaction: Any) -> None:
            results.append(self.stage(key, transaction))  # A retried attempt stages again.
            transaction.set(self.client.collection("sim_orders").document(key), {"key": key})
            if not commit:
                raise _RolledBack

        with contextlib.suppress(_RolledBack):
            self.firestore.transactional(work)(self.client.transaction())
        return results[-1]

    def close(self) -> None:
        self.db.close()
        self.client.close()  # type: ignore[no-untyped-call]


class _SpannerWorld:
    """The store's database: the relay's :class:`~tasklease.outbox.spanner_db.SpannerOutbox`
    and the users' client on it."""

    def __init__(self, database: str, stage: _Stage, paused: _Pause) -> None:
        from google.cloud import spanner  # noqa: PLC0415 - the spanner extra.

        from tasklease.outbox.spanner_db import SpannerOutbox  # noqa: PLC0415

        self.stage = stage
        self.db = SpannerOutbox(database)
        self.outbox = paused(self.db)
        self.db.migrate()
        project, instance, database_id = database.split("/")[1::2]
        self.client = spanner.Client(project=project)
        self.database: Any = self.client.instance(instance).database(  # type: ignore[no-untyped-call]
            database_id
        )
        ddl = "CREATE TABLE IF NOT EXISTS sim_orders (key STRING(MAX) NOT NULL) PRIMARY KEY (key)"
        self.database.update_ddl([ddl]).result(120)

    def user_transaction(self, key: str, commit: bool) -> EnqueueResult:
        results: list[EnqueueResult] = []

        def work(transaction: Any) -> None:
            results.append(self.stage(key, transaction))  # A retried attempt stages again.
            transaction.insert("sim_orders", ("key",), [[key]])
            if not commit:
                raise _RolledBack

        with contextlib.suppress(_RolledBack):
            self.database.run_in_transaction(work)
        return results[-1]

    def close(self) -> None:
        self.db.close()
        self.client.close()  # type: ignore[no-untyped-call]
