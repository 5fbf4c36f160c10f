"""The ledger a simulated transactional handler writes its effect to, inside the handler's own
store transaction (``ctx.transaction``): what the history checker reads back instead of
trusting tasklease's run records.

A row is written through the store's native transaction object, so it commits exactly when
the handler's transaction commits (with the run's completion or step record) and vanishes
when it rolls back. It is read back through a connection or client of the ledger's own, a
fresh read of the database that sees only what was committed. Each write adds a row, never
replaces one: an effect committed twice shows as two rows.

One table (a collection on Firestore) per store, :data:`LEDGER_TABLE`, beside the store's
own: in its SQLite file, in its Postgres schema, in its Spanner database; on Firestore, whose
stores of different simulations share one database, under the store's collection
(``tasklease_simulation_ledger/<collection>/rows``). One ledger per store at a time: the
Firestore and Spanner ledgers number their rows' keys themselves.
"""

from __future__ import annotations

import itertools
import sqlite3
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tasklease.worker.stores.base.store import LeaseStore

if TYPE_CHECKING:
    from tasklease.worker.stores.firestore.store import FirestoreStore
    from tasklease.worker.stores.postgres.store import PostgresStore
    from tasklease.worker.stores.spanner.store import SpannerStore
    from tasklease.worker.stores.sqlite.store import SqliteStore

__all__ = ["LEDGER_TABLE", "EffectLedger", "LedgerRow", "ledger_for"]

LEDGER_TABLE = "tasklease_simulation_ledger"
# A run id no run has: reading it makes a store create its file, schema or tables.
_NO_RUN = "tasklease-simulation-ledger"
# Seconds a ledger's own database call may take (DDL on the Spanner emulator is the slowest).
_CALL_TIMEOUT = 60.0


@dataclass(frozen=True, order=True)
class LedgerRow:
    """One committed effect: which attempt of which run made it, and a short label of it
    (``"charge"``, ``"step:a"``). Rows sort by run, attempt, then effect."""

    run_id: str
    attempt_id: str
    effect: str


class EffectLedger(Protocol):
    """A store's ledger (see the module)."""

    def prepare(self) -> None:
        """Create the table if missing and empty it; safe to call again."""

    def write(self, transaction: Any, row: LedgerRow) -> None:
        """Add ``row`` through ``transaction``, the handler's ``ctx.transaction``."""

    def rows(self) -> list[LedgerRow]:
        """Every committed row, sorted, read through the ledger's own connection."""

    def close(self) -> None:
        """Close the ledger's own connection or client (the store is the caller's)."""


def ledger_for(store: LeaseStore) -> EffectLedger | None:
    """The ledger on ``store``'s database: for SQLite, Postgres, Firestore and Spanner
    stores (their subclasses too). None for a store without transactions (memory) or one
    this module cannot write into (a store of one's own): it runs no transactional handler
    in a simulation."""
    for module, name, make in _LEDGERS:
        # A store is an instance of a backend's class only once its module was imported, so
        # asking sys.modules never imports an optional extra (psycopg, google-cloud-*).
        loaded = sys.modules.get(module)
        store_class = getattr(loaded, name, None)
        if store_class is not None and isinstance(store, store_class):
            return make(store)
    return None


def _sorted_rows(found: Iterable[Iterable[Any]]) -> list[LedgerRow]:
    """Rows as read, sorted in Python: a database's collation may order text otherwise."""
    return sorted(LedgerRow(*(str(value) for value in row)) for row in found)


class SqliteLedger:
    """The ledger in a :class:`SqliteStore`'s file: ``ctx.transaction`` is the store's
    writing ``sqlite3.Connection`` inside ``BEGIN IMMEDIATE``."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    def prepare(self) -> None:
        # The store makes its file (private, in WAL mode) itself: a file another connection
        # made first would not be private, and the store would refuse it.
        self.store.get(_NO_RUN)
        with self._connection() as connection:
            connection.execute(
                f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (id INTEGER PRIMARY KEY, "
                "run_id TEXT NOT NULL, attempt_id TEXT NOT NULL, effect TEXT NOT NULL)"
            )
            connection.execute(f"DELETE FROM {LEDGER_TABLE}")  # noqa: S608 - a constant name.

    def write(self, transaction: Any, row: LedgerRow) -> None:
        transaction.execute(
            f"INSERT INTO {LEDGER_TABLE} (run_id, attempt_id, effect) VALUES (?, ?, ?)",  # noqa: S608 - a constant name.
            (row.run_id, row.attempt_id, row.effect),
        )

    def rows(self) -> list[LedgerRow]:
        with self._connection() as connection:
            found = connection.execute(
                f"SELECT run_id, attempt_id, effect FROM {LEDGER_TABLE}"  # noqa: S608 - a constant name.
            ).fetchall()
        return _sorted_rows(found)

    def close(self) -> None:
        """Nothing to close: each call opens and closes a connection of its own."""

    def _connection(self) -> _ClosingConnection:
        return _ClosingConnection(self.store.path, _CALL_TIMEOUT)


class _ClosingConnection:
    """A ``sqlite3`` connection in autocommit mode, closed at the end of a ``with`` block
    (``sqlite3.Connection``'s own ``with`` commits but does not close)."""

    def __init__(self, path: Any, timeout: float) -> None:
        self.connection = sqlite3.connect(path, timeout=timeout, isolation_level=None)

    def __enter__(self) -> sqlite3.Connection:
        return self.connection

    def __exit__(self, *exc: object) -> None:
        self.connection.close()


class PostgresLedger:
    """The ledger in a :class:`PostgresStore`'s schema: ``ctx.transaction`` is the store's
    pooled psycopg connection inside ``BEGIN``, in pipeline mode."""

    def __init__(self, store: PostgresStore) -> None:
        from psycopg import sql  # noqa: PLC0415 - the optional extra, on use only.

        self.store = store
        self.table = sql.Identifier(store.options.schema, LEDGER_TABLE)
        self._sql = sql

    def prepare(self) -> None:
        self.store.get(_NO_RUN)  # The store creates (migrates) its schema on first use.
        sql = self._sql
        with self._connection() as connection:
            connection.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (id bigint GENERATED ALWAYS AS IDENTITY "
                    "PRIMARY KEY, run_id text NOT NULL, attempt_id text NOT NULL, "
                    "effect text NOT NULL)"
                ).format(self.table)
            )
            connection.execute(sql.SQL("TRUNCATE {}").format(self.table))

    def write(self, transaction: Any, row: LedgerRow) -> None:
        statement = self._sql.SQL(
            "INSERT INTO {} (run_id, attempt_id, effect) VALUES (%s, %s, %s)"
        ).format(self.table)
        transaction.execute(statement, (row.run_id, row.attempt_id, row.effect))

    def rows(self) -> list[LedgerRow]:
        statement = self._sql.SQL("SELECT run_id, attempt_id, effect FROM {}").format(self.table)
        with self._connection() as connection:
            return _sorted_rows(connection.execute(statement).fetchall())

    def close(self) -> None:
        """Nothing to close: each call opens and closes a connection of its own."""

    def _connection(self) -> Any:
        import psycopg  # noqa: PLC0415 - the optional extra, on use only.

        # The store's own connection string: its server, database and session settings.
        return psycopg.connect(self.store.connections.conninfo, autocommit=True)


class FirestoreLedger:
    """The ledger under a :class:`FirestoreStore`'s collection: ``ctx.transaction`` is the
    store client's ``firestore.Transaction``. Rows are documents ``create()``d in it (a key
    used twice fails the transaction rather than replacing a row); they are read back by a
    query of the ledger's own client, strongly consistent as every query is in Native mode
    (https://cloud.google.com/firestore/docs/firestore-or-datastore)."""

    def __init__(self, store: FirestoreStore) -> None:
        self.store = store
        self._keys = itertools.count()
        self._client: Any = None

    def prepare(self) -> None:
        rows = self._rows_collection(self._reader())
        while True:
            documents = list(rows.limit(500).stream(timeout=_CALL_TIMEOUT))
            if not documents:
                return
            batch = self._reader().batch()
            for document in documents:
                batch.delete(document.reference)
            batch.commit(timeout=_CALL_TIMEOUT)

    def write(self, transaction: Any, row: LedgerRow) -> None:
        # A transaction run again (aborted) writes under a new key; only its last try commits.
        key = f"{next(self._keys):012d}"
        document = self._rows_collection(self.store.client).document(key)
        transaction.create(
            document, {"run_id": row.run_id, "attempt_id": row.attempt_id, "effect": row.effect}
        )

    def rows(self) -> list[LedgerRow]:
        found = self._rows_collection(self._reader()).stream(timeout=_CALL_TIMEOUT)
        fields = ("run_id", "attempt_id", "effect")
        return _sorted_rows([document.get(name) for name in fields] for document in found)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and client is not self.store.client:
            client.close()

    def _rows_collection(self, client: Any) -> Any:
        return client.collection(LEDGER_TABLE).document(self.store.collection).collection("rows")

    def _reader(self) -> Any:
        """The ledger's own client on the store's database; the store's client when the
        store names no database (it was given a client, which alone knows it)."""
        if self._client is None:
            database = self.store.database
            if database is None:
                self._client = self.store.client
            else:
                from google.cloud import firestore  # noqa: PLC0415 - the optional extra.

                self._client = firestore.Client(
                    project=self.store.client.project, database=database
                )
        return self._client


class SpannerLedger:
    """The ledger in a :class:`SpannerStore`'s database: ``ctx.transaction`` is the
    read-write ``spanner_v1.Transaction``. Rows are ``insert`` mutations in it (a key used
    twice fails the transaction rather than replacing a row); they are read back by a strong
    read (a snapshot's default) of the ledger's own client."""

    def __init__(self, store: SpannerStore) -> None:
        self.store = store
        self._keys = itertools.count()
        self._database: Any = None

    def prepare(self) -> None:
        from tasklease.plumbing.spanner_calls import run_transaction  # noqa: PLC0415 - extra.

        database = self._reader()
        if not self._exists(database):
            ddl = (
                f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (row_key STRING(MAX) NOT NULL, "
                "run_id STRING(MAX) NOT NULL, attempt_id STRING(MAX) NOT NULL, "
                "effect STRING(MAX) NOT NULL) PRIMARY KEY (row_key)"
            )
            database.update_ddl([ddl]).result(_CALL_TIMEOUT)
        run_transaction(
            database,
            lambda transaction: transaction.execute_update(
                f"DELETE FROM {LEDGER_TABLE} WHERE true"  # noqa: S608 - a constant name.
            ),
            _CALL_TIMEOUT,
            "empty the simulation ledger",
        )

    def write(self, transaction: Any, row: LedgerRow) -> None:
        # A transaction run again (aborted) writes under a new key; only its last try commits.
        key = f"{next(self._keys):012d}"
        transaction.insert(
            LEDGER_TABLE,
            ("row_key", "run_id", "attempt_id", "effect"),
            [[key, row.run_id, row.attempt_id, row.effect]],
        )

    def rows(self) -> list[LedgerRow]:
        sql = f"SELECT run_id, attempt_id, effect FROM {LEDGER_TABLE}"  # noqa: S608 - a constant name.
        with self._reader().snapshot() as snapshot:
            return _sorted_rows(snapshot.execute_sql(sql, timeout=_CALL_TIMEOUT))

    def close(self) -> None:
        database, self._database = self._database, None
        if database is not None:
            # As SpannerStore.close: the transport, not database.close(), which waits on the
            # multiplexed session's refresher (it sleeps minutes between looks at its stop flag).
            database.spanner_api.transport.close()

    def _reader(self) -> Any:
        """The ledger's own ``spanner.Database`` on the store's database."""
        if self._database is None:
            from google.cloud import spanner  # noqa: PLC0415 - the optional extra.

            _, project, _, instance, _, database_id = self.store.database_path.split("/")
            client = spanner.Client(project=project)
            self._database = client.instance(instance).database(database_id)  # type: ignore[no-untyped-call]
        return self._database

    @staticmethod
    def _exists(database: Any) -> bool:
        """Whether the ledger's table is there (a DDL statement, even one that changes
        nothing, is a long-running operation on Spanner)."""
        from google.cloud import spanner  # noqa: PLC0415 - the optional extra.

        sql = (
            "SELECT COUNT(*) FROM information_schema.tables "
            "WHERE table_schema = '' AND table_name = @table"
        )
        with database.snapshot() as snapshot:
            found = snapshot.execute_sql(
                sql,
                params={"table": LEDGER_TABLE},
                param_types={"table": spanner.param_types.STRING},
            )
            return bool(next(iter(found))[0])


_LEDGERS: tuple[tuple[str, str, Callable[[Any], EffectLedger]], ...] = (
    ("tasklease.worker.stores.sqlite.store", "SqliteStore", SqliteLedger),
    ("tasklease.worker.stores.postgres.store", "PostgresStore", PostgresLedger),
    ("tasklease.worker.stores.firestore.store", "FirestoreStore", FirestoreLedger),
    ("tasklease.worker.stores.spanner.store", "SpannerStore", SpannerLedger),
)
"""Each backend's store class (by module, never imported here) and its ledger."""
