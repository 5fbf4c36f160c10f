"""The embedded default store: one SQLite file, safe across the threads and processes of a host.

Every change runs in a ``BEGIN IMMEDIATE`` transaction, which takes SQLite's write lock before
reading, so two processes (gunicorn workers sharing the file) never both claim one run. WAL
mode lets reads proceed meanwhile, and ``synchronous=FULL`` makes each commit durable, so a
completed record survives a crash or power loss.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from worker.errors import StoreUnavailable
from worker.records import Claim, ClaimRequest, RunRecord, RunStatus
from worker.stores.base import Change, LeaseStore, Moment, resolve

_T = TypeVar("_T")
_log = logging.getLogger("tasklease.store")

_SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    handler TEXT NOT NULL,
    status TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    fencing_token INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    lease_expires_us INTEGER NOT NULL,
    expire_at_us INTEGER NOT NULL,
    claimed_at_us INTEGER NOT NULL,
    finished_at_us INTEGER,
    identity TEXT NOT NULL,
    result TEXT,
    error TEXT,
    payload TEXT,
    caller TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS runs_by_expiry ON runs (expire_at_us);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, claimed_at_us);
"""
_COLUMNS = (
    "run_id, kind, handler, status, attempt_id, fencing_token, attempts, lease_expires_us, "
    "expire_at_us, claimed_at_us, finished_at_us, identity, result, error, payload, caller"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Only these constant column lists are interpolated into SQL; every value is a parameter.
_SELECT = f"SELECT {_COLUMNS} FROM runs"  # noqa: S608
_SELECT_ONE = f"{_SELECT} WHERE run_id = ?"
_PLACEHOLDERS = ", ".join("?" * len(_COLUMNS.split(", ")))
_UPSERT = f"INSERT OR REPLACE INTO runs ({_COLUMNS}) VALUES ({_PLACEHOLDERS})"  # noqa: S608


class SqliteStore(LeaseStore):
    """Run records in a SQLite file at ``path`` (created, with its folder, on first use).

    The file is opened lazily, per thread and per process (connections never cross a fork),
    so a worker starts even while the file is unreachable and answers 503 until it is back.
    Records past ``expire_at`` are purged every ``purge_interval`` by the process that claims.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: timedelta = timedelta(seconds=10),
        purge_interval: timedelta = timedelta(minutes=10),
    ) -> None:
        self.path = Path(path)
        self._busy_timeout = busy_timeout
        self._purge_interval = purge_interval.total_seconds()
        self._local = threading.local()
        self._schema_ready_pid: int | None = None
        self._schema_lock = threading.Lock()
        self._next_purge = 0.0

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def claim(self, request: ClaimRequest, now: Moment) -> Claim:
        outcome = super().claim(request, now)
        self._purge_now_and_then(resolve(now))
        return outcome

    def _read_modify_write(self, run_id: str, change: Change[_T]) -> _T:
        with self._guard("change a run"):
            connection = self._connection()
            connection.execute("BEGIN IMMEDIATE")
            try:
                row = connection.execute(_SELECT_ONE, (run_id,)).fetchone()
                new_record, value = change(_decode(row) if row else None)
                if new_record is not None:
                    connection.execute(_UPSERT, _encode(new_record))
                connection.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise
            return value

    def get(self, run_id: str) -> RunRecord | None:
        with self._guard("read a run"):
            row = self._connection().execute(_SELECT_ONE, (run_id,)).fetchone()
        return _decode(row) if row else None

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        where, params = (" WHERE status = ?", [status.value]) if status else ("", [])
        with self._guard("list runs"):
            rows = (
                self._connection()
                .execute(
                    _SELECT + where + " ORDER BY claimed_at_us DESC LIMIT ?",
                    [*params, limit],
                )
                .fetchall()
            )
        return [_decode(row) for row in rows]

    def purge_expired(self, now: datetime) -> int:
        with self._guard("purge expired runs"):
            cursor = self._connection().execute(
                "DELETE FROM runs WHERE expire_at_us <= ?", (_micros(now),)
            )
            return cursor.rowcount

    def close(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def _purge_now_and_then(self, now: datetime) -> None:
        if time.monotonic() < self._next_purge:
            return
        self._next_purge = time.monotonic() + self._purge_interval
        try:
            purged = self.purge_expired(now)
        except StoreUnavailable:
            _log.warning("purging expired runs failed; will try again", exc_info=True)
            return
        if purged:
            _log.info("purged %d expired runs from %s", purged, self.path)

    def _connection(self) -> sqlite3.Connection:
        pid = os.getpid()
        if getattr(self._local, "pid", None) != pid or self._local.connection is None:
            self._local.connection = self._open()
            self._local.pid = pid
        connection: sqlite3.Connection = self._local.connection
        return connection

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        timeout = self._busy_timeout.total_seconds()
        # isolation_level=None: we issue BEGIN/COMMIT ourselves.
        connection = sqlite3.connect(
            self.path, timeout=timeout, isolation_level=None, check_same_thread=False
        )
        try:
            connection.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            connection.execute("PRAGMA synchronous = FULL")
            self._ensure_schema(connection)
        except BaseException:
            connection.close()
            raise
        return connection

    def _ensure_schema(self, connection: sqlite3.Connection) -> None:
        with self._schema_lock:
            if self._schema_ready_pid == os.getpid():
                return
            self._use_wal(connection)
            connection.execute("BEGIN IMMEDIATE")
            try:
                version = connection.execute("PRAGMA user_version").fetchone()[0]
                if version > _SCHEMA_VERSION:
                    raise StoreUnavailable(
                        f"{self.path} has schema version {version}; this tasklease knows "
                        f"{_SCHEMA_VERSION}: upgrade tasklease"
                    )
                if version == 1:  # Version 2 added the caller column.
                    connection.execute("ALTER TABLE runs ADD COLUMN caller TEXT")
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    connection.execute(statement)
                connection.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
                connection.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise
            self._schema_ready_pid = os.getpid()

    def _use_wal(self, connection: sqlite3.Connection) -> None:
        """Switch the file to WAL (a persistent setting), retrying while others hold it.

        Switching needs the file alone, and SQLite can answer "database is locked" at once
        there instead of waiting for busy_timeout: seen when several gunicorn workers open a
        fresh file together (tests/test_store_sqlite_open.py).
        """
        deadline = time.monotonic() + self._busy_timeout.total_seconds()
        pause = 0.005
        while True:
            try:
                if connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                    return
                if connection.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal":
                    return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
            if time.monotonic() > deadline:
                raise StoreUnavailable(f"{self.path}: could not switch to WAL mode: file busy")
            time.sleep(pause)
            pause = min(pause * 2, 0.2)

    @contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        """Turn any SQLite or file-system error into :class:`StoreUnavailable`."""
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"SQLite store {self.path}: could not {action}: {exc}") from exc


def _micros(moment: datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _moment(micros: int | None) -> datetime | None:
    return None if micros is None else _EPOCH + timedelta(microseconds=micros)


def _encode(record: RunRecord) -> tuple[Any, ...]:
    return (
        record.run_id,
        record.kind,
        record.handler,
        record.status.value,
        record.attempt_id,
        record.fencing_token,
        record.attempts,
        _micros(record.lease_expires),
        _micros(record.expire_at),
        _micros(record.claimed_at),
        None if record.finished_at is None else _micros(record.finished_at),
        json.dumps(record.identity, sort_keys=True),
        record.result_json,
        record.error,
        record.payload,
        record.caller,
    )


def _decode(row: tuple[Any, ...]) -> RunRecord:
    (run_id, kind, handler, status, attempt_id, fencing_token, attempts, lease_expires,
     expire_at, claimed_at, finished_at, identity, result, error, payload,
     caller) = row  # fmt: skip
    return RunRecord(
        run_id=run_id,
        kind=kind,
        handler=handler,
        status=RunStatus(status),
        attempt_id=attempt_id,
        fencing_token=fencing_token,
        attempts=attempts,
        lease_expires=_EPOCH + timedelta(microseconds=lease_expires),
        expire_at=_EPOCH + timedelta(microseconds=expire_at),
        claimed_at=_EPOCH + timedelta(microseconds=claimed_at),
        finished_at=_moment(finished_at),
        identity=json.loads(identity),
        # Version 1 stored a missing result as the JSON text "null".
        result_json=None if result in (None, "null") else result,
        error=error,
        payload=payload,
        caller=caller,
    )
