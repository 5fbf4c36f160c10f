"""Finding: SQLAlchemy's own recipe for real transactions on SQLite (pysqlite's
``isolation_level = None`` on connect, and ``BEGIN`` emitted on SQLAlchemy's "begin" event:
the SQLite dialect's documentation, "Serializable isolation / Savepoints / Transactional
DDL") was refused by ``enqueue(..., transaction=conn)`` as AUTOCOMMIT, although the
connection is inside a transaction that commits or rolls back the entry with the caller's
rows. Only a connection that would commit the entry on its own is refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import event

from tasklease.outbox import NotInTransaction
from tests.support.outbox import producer, sqlite_app_db


def _recipe_engine(path: Path) -> sqlalchemy.Engine:
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite's own BEGIN handling off.

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


def _entries(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM tasklease_outbox").fetchone()[0])


def test_an_explicit_begin_on_a_pysqlite_connection_stages_inside_that_transaction(
    tmp_path: Path,
) -> None:
    path = tmp_path / "app.db"
    sqlite_app_db(path)
    engine = _recipe_engine(path)
    make = producer("http://127.0.0.1:9")
    with pytest.raises(RuntimeError, match="rolled back"), engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO orders (id) VALUES ('gone')")
        make.enqueue("send_receipt", {}, key="gone", transaction=conn)
        raise RuntimeError("rolled back")
    assert _entries(path) == 0
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO orders (id) VALUES ('kept')")
        assert make.enqueue("send_receipt", {}, key="kept", transaction=conn).staged
    assert _entries(path) == 1
    engine.dispose()


def test_a_pysqlite_connection_in_autocommit_isolation_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    sqlite_app_db(path)
    engine = sqlalchemy.create_engine(f"sqlite:///{path}", isolation_level="AUTOCOMMIT")
    with engine.begin() as conn, pytest.raises(NotInTransaction, match="AUTOCOMMIT"):
        producer("http://127.0.0.1:9").enqueue("x", {}, key="k", transaction=conn)
    assert _entries(path) == 0
    engine.dispose()
