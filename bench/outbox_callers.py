"""The callers of bench/outbox_relay.py: one order transaction, with or without its enqueue,
on each database the outbox supports (SQLite, Postgres, Firestore, Spanner)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from tasklease.outbox import open_outbox
from tasklease.outbox.db import SQLOutbox
from tasklease.producer import Producer


class Caller:
    """An application's transactions on one database, and the outbox's ``sent_at``."""

    url: str
    fast_path: str

    def order(self, key: str, make: Producer | None) -> str | None:
        """One transaction: insert order ``key`` and (``make`` given) enqueue its task."""
        raise NotImplementedError

    def stage(self, make: Producer, items: Sequence[tuple[str, Any]]) -> None:
        """Commit one entry per item (in as few transactions as the database allows)."""
        raise NotImplementedError

    def sent_at(self, entry_id: str) -> float | None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class SqlCaller(Caller):
    def __init__(self, url: str, connect: Callable[[], Any], fast_path: str) -> None:
        self.url, self.fast_path = url, fast_path
        self.conn = connect()
        self.reader = open_outbox(url)
        self.mark = "?" if isinstance(self.conn, sqlite3.Connection) else "%s"

    def order(self, key: str, make: Producer | None) -> str | None:
        conn = self.conn
        if isinstance(conn, sqlite3.Connection):
            conn.execute("BEGIN")
        conn.cursor().execute(f"INSERT INTO orders VALUES ({self.mark})", (key,))
        name = None
        if make is not None:
            name = make.enqueue("record", {"k": key}, key=key, transaction=conn).name
        conn.commit()
        return name

    def stage(self, make: Producer, items: Sequence[tuple[str, Any]]) -> None:
        if isinstance(self.conn, sqlite3.Connection):
            self.conn.execute("BEGIN")
        make.enqueue_many("record", items, transaction=self.conn)
        self.conn.commit()

    def sent_at(self, entry_id: str) -> float | None:
        db = self.reader
        assert isinstance(db, SQLOutbox)  # A SQL caller's outbox: read back with its SQL.
        with db._transaction() as cursor:
            query = f"SELECT sent_at FROM tasklease_outbox WHERE id = {db._mark()}"
            cursor.execute(query, (entry_id,))
            row = cursor.fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def close(self) -> None:
        self.reader.close()
        self.conn.close()


class FirestoreCaller(Caller):
    """``@firestore.transactional`` orders in a project of their own (its own outbox)."""

    fast_path = "listener"

    def __init__(self, project: str) -> None:
        from google.cloud import firestore  # noqa: PLC0415

        self.url = f"firestore://?project={project}"
        self.firestore = firestore
        self.client = firestore.Client(project=project)

    def order(self, key: str, make: Producer | None) -> str | None:
        names: list[str] = []

        @self.firestore.transactional
        def order(tx: Any) -> None:
            names.clear()
            tx.set(self.client.collection("orders").document(key), {"k": key})
            if make is not None:
                names.append(make.enqueue("record", {"k": key}, key=key, transaction=tx).name)

        order(self.client.transaction())
        return names[0] if names else None

    def stage(self, make: Producer, items: Sequence[tuple[str, Any]]) -> None:
        @self.firestore.transactional
        def stage(tx: Any, chunk: Sequence[tuple[str, Any]]) -> None:
            make.enqueue_many("record", chunk, transaction=tx)

        for start in range(0, len(items), 500):  # Firestore's writes per commit.
            stage(self.client.transaction(), items[start : start + 500])

    def sent_at(self, entry_id: str) -> float | None:
        from tasklease.outbox.firestore import doc_id  # noqa: PLC0415

        ref = self.client.collection("tasklease_outbox").document(doc_id(entry_id))
        snapshot = ref.get(field_paths=["sent_at"])
        value = snapshot.get("sent_at") if snapshot.exists else None
        return None if value is None else float(value)

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]


class SpannerCaller(Caller):
    """``run_in_transaction`` orders in the Spanner database at ``path`` (outbox migrated)."""

    fast_path = "in-process wake on commit"

    def __init__(self, path: str) -> None:
        from google.cloud import spanner  # noqa: PLC0415

        _, project, _, instance, _, name = path.split("/")
        self.url = f"spanner://{path}"
        db = open_outbox(self.url)
        db.migrate()
        db.close()
        self.client = spanner.Client(project=project)
        self.database = self.client.instance(instance).database(name)  # type: ignore[no-untyped-call]
        orders = "CREATE TABLE orders (id STRING(64) NOT NULL) PRIMARY KEY (id)"
        self.database.update_ddl([orders]).result(120)

    def order(self, key: str, make: Producer | None) -> str | None:
        def order(tx: Any) -> str | None:
            tx.insert("orders", ("id",), [[key]])
            if make is None:
                return None
            return make.enqueue("record", {"k": key}, key=key, transaction=tx).name

        name: str | None = self.database.run_in_transaction(order)
        return name

    def stage(self, make: Producer, items: Sequence[tuple[str, Any]]) -> None:
        for start in range(0, len(items), 1000):
            chunk = items[start : start + 1000]
            self.database.run_in_transaction(
                lambda tx, chunk=chunk: make.enqueue_many("record", chunk, transaction=tx)
            )

    def sent_at(self, entry_id: str) -> float | None:
        from google.cloud.spanner_v1 import KeySet  # noqa: PLC0415

        with self.database.snapshot() as snapshot:
            keys = KeySet(keys=[[entry_id]])  # type: ignore[no-untyped-call]
            rows = list(snapshot.read("tasklease_outbox", ("sent_at",), keys))
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]
