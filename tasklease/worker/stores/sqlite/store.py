"""The embedded default store: one SQLite file, safe across the threads and processes of a host.

Every change runs in a ``BEGIN IMMEDIATE`` transaction, which takes SQLite's write lock before
reading, so two processes (gunicorn workers sharing the file) never both claim one run. WAL
mode lets reads proceed meanwhile, and ``synchronous=FULL`` makes each commit durable: in WAL
mode SQLite then syncs the log on every commit, so a claim or completion that returned survives
a crash or a power cut (https://www.sqlite.org/pragma.html#pragma_synchronous; NORMAL would
not: "a transaction committed in WAL mode with synchronous=NORMAL might roll back following a
power loss"). That sync is most of a change's cost, so:

- changes made at once by the threads of one process share a transaction and its sync
  (:mod:`tasklease.plumbing.group_commit`);
- processes take turns through an ``flock`` on ``<file>.lock`` before taking SQLite's write
  lock: the kernel wakes the next writer the moment the lock is free, where SQLite's own busy
  handler would poll with sleeps of up to 100 ms. Writers that do not take the ``flock``
  (an old tasklease, the sqlite3 shell) are still excluded by SQLite's lock and busy timeout.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from tasklease.errors import StoreUnavailable
from tasklease.plumbing import private_files
from tasklease.plumbing.group_commit import ChangeBatcher, Pending
from tasklease.plumbing.per_process import PerProcess
from tasklease.plumbing.writer_lock import WriterLock, WriterLockTimeout
from tasklease.worker.core import decisions, steps
from tasklease.worker.core.queries import Position, RunFilter
from tasklease.worker.core.records import Claim, ClaimRequest, LockRecord, RunRecord, RunStatus
from tasklease.worker.stores.base.codec import Conversion, RecordCodec
from tasklease.worker.stores.base.locks import LockStore
from tasklease.worker.stores.base.queries import OperatorQueries
from tasklease.worker.stores.base.store import Change, LockChange, Moment, resolve
from tasklease.worker.stores.base.tally import TALLY_KEPT
from tasklease.worker.stores.base.transactional import (
    StepWork,
    TransactionalStore,
    TransactionOutcome,
    Work,
)
from tasklease.worker.stores.sqlite import locks, tally, wal
from tasklease.worker.stores.sqlite.locks import micros as _micros
from tasklease.worker.stores.sqlite.transactions import (
    HandlerDatabaseError,
    SqliteTransaction,
    run_transaction,
)

_T = TypeVar("_T")
_log = logging.getLogger("tasklease.store")

_SCHEMA_VERSION = 3  # 2: runs.caller; 3: the locks table (exclusive jobs, concurrency keys).
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
    caller TEXT,
    replay_of TEXT,
    replayed_as TEXT,
    steps_json TEXT,
    continuation_json TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS runs_by_expiry ON runs (expire_at_us);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, claimed_at_us);
CREATE TABLE IF NOT EXISTS locks (
    name TEXT PRIMARY KEY,
    holder_run_id TEXT NOT NULL,
    holder_attempt_id TEXT NOT NULL,
    fencing_token INTEGER NOT NULL,
    started_at_us INTEGER NOT NULL,
    lease_expires_us INTEGER NOT NULL,
    safety_expires_us INTEGER NOT NULL,
    next_start_at_us INTEGER NOT NULL,
    released_at_us INTEGER,
    lapses_at_us INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS locks_by_lapse ON locks (lapses_at_us);
-- Operator listings and look-ups (tasklease runs, the dashboard): no version bump needed.
CREATE INDEX IF NOT EXISTS runs_by_claim ON runs (claimed_at_us, run_id);
CREATE INDEX IF NOT EXISTS runs_by_handler ON runs (handler, claimed_at_us);
-- Partial: a run has a task name or a job name, never both, so each claim writes one of the
-- two (the full indexes, dropped below, put every task run in the job index's NULL range).
CREATE INDEX IF NOT EXISTS runs_by_task ON runs (json_extract(identity, '$.task_name'))
    WHERE json_extract(identity, '$.task_name') IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_by_job ON runs (json_extract(identity, '$.job_name'))
    WHERE json_extract(identity, '$.job_name') IS NOT NULL;
DROP INDEX IF EXISTS runs_by_task_name;
DROP INDEX IF EXISTS runs_by_job_name;
"""
# Columns added without a schema version: added when missing, whatever the version says, so
# this works alongside other migrations. An older tasklease ignores (and, rewriting a run,
# clears) them: operators' replay links, and a run's durable steps (an older tasklease
# rewriting a run drops its steps: its retry then runs them again, as that version would).
_ADDED_COLUMNS = {
    "replay_of": "TEXT",
    "replayed_as": "TEXT",
    "steps_json": "TEXT",
    "continuation_json": "TEXT",
}
# Times as integer microseconds in ``<field>_us`` columns, the identity as JSON text, the
# result under "result" (version 1 stored a missing result as the JSON text "null").
_CODEC = RecordCodec(
    RunRecord,
    time=locks.MICROS,
    mapping=Conversion(lambda identity: json.dumps(identity, sort_keys=True), json.loads),
    renames={**locks.renamed_times(RunRecord), "result_json": "result"},
    overrides={"result_json": Conversion(decode=lambda text: None if text == "null" else text)},
)
_COLUMNS = ", ".join(_CODEC.names)
# Only these constant column lists are interpolated into SQL; every value is a parameter.
_SELECT = f"SELECT {_COLUMNS} FROM runs"  # noqa: S608
_SELECT_ONE = f"{_SELECT} WHERE run_id = ?"
_PLACEHOLDERS = ", ".join("?" * len(_COLUMNS.split(", ")))
_INSERT = f"INSERT INTO runs ({_COLUMNS}) VALUES ({_PLACEHOLDERS})"  # noqa: S608
# A run's record changes in place. Its run id, kind, handler and identity never change (the
# run id is their hash), so they stay out of the SET: SQLite updates only the indexes on
# columns an UPDATE names, and the handler and identity indexes then cost nothing.
_FIXED = ("run_id", "kind", "handler", "identity")
_STATE = [column for column in _COLUMNS.split(", ") if column not in _FIXED]
_UPDATE = (
    f"UPDATE runs SET {', '.join(f'{column} = ?' for column in _STATE)} "  # noqa: S608
    "WHERE run_id = ?"
)
_STATE_AT = [_COLUMNS.split(", ").index(column) for column in _STATE]
_IDENTITY_AT = [_COLUMNS.split(", ").index(column) for column in _FIXED]


class SqliteStore(LockStore, OperatorQueries, tally.SqliteTally, TransactionalStore):
    """Run records in a SQLite file at ``path`` (created 0600, with any missing folder 0700,
    on first use: records hold payloads and errors).

    The file is opened lazily, per thread and per process (connections never cross a fork),
    so a worker starts even while the file is unreachable and answers 503 until it is back.
    Records past ``expire_at`` are purged every ``purge_interval`` by the process that claims.
    """

    shared_across_instances: ClassVar[bool] = False  # One process / one machine's disk.

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
        # A child must not inherit a batch in flight at fork: each process groups its own.
        self._batches = PerProcess(lambda: ChangeBatcher(self._commit_batch))
        # The one connection this process's batches write through (one batch at a time).
        # SQLite empties a connection's page cache whenever another connection changed the
        # file, so a batch on a per-thread connection would reread its pages after every
        # other thread's commit; one writing connection per process keeps them.
        self._writing = PerProcess(self._open)
        self._writer_lock = WriterLock(
            Path(f"{self.path}.lock"), lambda: private_files.make_private_dirs(self.path.parent)
        )

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def claim(self, request: ClaimRequest, now: Moment) -> Claim:
        outcome = super().claim(request, now)
        self._purge_now_and_then(resolve(now))
        return outcome

    def _read_modify_write(self, run_id: str, change: Change[_T]) -> _T:
        def work(connection: sqlite3.Connection) -> _T:
            row = connection.execute(_SELECT_ONE, (run_id,)).fetchone()
            new_record, value = change(_decode(row) if row else None)
            if new_record is not None:
                try:
                    _write(connection, row, _encode(new_record))
                except (UnicodeError, OverflowError) as exc:  # The contract: nothing else.
                    raise StoreUnavailable(f"SQLite store: cannot store the record: {exc}") from exc
            return value

        value: _T = self._batches.get().run(work)
        return value

    def complete_in_transaction(
        self,
        run_id: str,
        attempt_id: str,
        work: Work,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> TransactionOutcome:
        """``ctx.transaction`` is a ``sqlite3.Connection`` inside ``BEGIN IMMEDIATE`` on this
        database file (see :mod:`.sqlite_transactions`)."""

        def completed(record: RunRecord, result_json: str | None) -> RunRecord:
            at = resolve(now)
            return decisions.kept(decisions.completed(record, result_json, at), at, keep_for)

        held, result_json = self._in_transaction(run_id, attempt_id, work, completed)
        return TransactionOutcome(held=held, result_json=result_json if held else None)

    def record_step_in_transaction(
        self, run_id: str, attempt_id: str, step_work: StepWork, now: Moment
    ) -> TransactionOutcome:
        """The step's transaction is a transactional handler's: see above."""
        held, step = self._in_transaction(run_id, attempt_id, step_work, steps.with_step)
        return TransactionOutcome(held=held, result_json=step.result_json if held else None)

    def _in_transaction(
        self,
        run_id: str,
        attempt_id: str,
        work: Callable[[SqliteTransaction], _T],
        change: Callable[[RunRecord, _T], RunRecord],
    ) -> tuple[bool, _T]:
        """``work``, then the run's record changed by ``change`` if ``attempt_id`` holds it."""

        def finish(connection: sqlite3.Connection, value: _T) -> bool:
            row = connection.execute(_SELECT_ONE, (run_id,)).fetchone()
            if row is None or not decisions.holds(_decode(row), attempt_id):
                return False
            _write(connection, row, _encode(change(_decode(row), value)))
            return True

        def transaction() -> tuple[bool, _T]:
            with self._guard("run a transaction"):
                return run_transaction(self._writing.get(), work, finish, self._writer)

        try:
            return self._batches.get().alone(transaction)
        except HandlerDatabaseError as exc:  # The handler's own statement failed.
            raise exc.error from exc

    def _read_modify_write_lock(self, name: str, change: LockChange[_T]) -> _T:
        def work(connection: sqlite3.Connection) -> _T:
            def read(run_id: str) -> RunRecord | None:  # In the same write transaction.
                row = connection.execute(_SELECT_ONE, (run_id,)).fetchone()
                return _decode(row) if row else None

            new_lock, value = change(locks.read(connection, name), read)
            if new_lock is not None:
                locks.write(connection, new_lock)
            return value

        value: _T = self._batches.get().run(work)
        return value

    def get_lock(self, name: str) -> LockRecord | None:
        with self._guard("read a lock"):
            return locks.read(self._connection(), name)

    def list_locks(self, limit: int = 100) -> list[LockRecord]:
        with self._guard("list locks"):
            return locks.listed(self._connection(), limit)

    def _commit_batch(self, batch: list[Pending[sqlite3.Connection]]) -> None:
        """Apply a batch of changes in one write transaction: one commit, one sync."""
        try:
            with self._guard("change a run"), self._writer():
                connection = self._writing.get()
                connection.execute("BEGIN IMMEDIATE")
                try:
                    for pending in batch:
                        try:
                            pending.value = pending.work(connection)
                        except sqlite3.Error:
                            raise
                        except Exception as exc:  # A change's own error: it wrote nothing.
                            pending.error = exc
                    connection.execute("COMMIT")
                except BaseException:
                    if connection.in_transaction:
                        connection.execute("ROLLBACK")
                    raise
        except StoreUnavailable as exc:
            for pending in batch:  # Nothing of the batch was committed.
                pending.error = exc

    @contextmanager
    def _writer(self) -> Iterator[None]:
        """Hold this store's cross-process writer lock (see the module docstring); a holder
        that hangs (stopped, stuck on a dead disk) costs a 503 after busy_timeout, as SQLite's
        own lock would."""
        try:
            with self._writer_lock.held(self._busy_timeout.total_seconds()):
                yield
        except WriterLockTimeout as exc:
            raise StoreUnavailable(f"SQLite store {self.path}: {exc}") from None

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

    # --- Operations: listing and lookup ------------------------------------------

    def _scan_runs(self, filters: RunFilter, after: Position | None, limit: int) -> list[RunRecord]:
        clauses: list[str] = []
        params: list[Any] = []
        status = filters.status_to_scan
        for column, value in (
            ("status", status.value if status else None),
            ("handler", filters.handler),
            ("kind", filters.kind),
        ):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if filters.older_than is not None:
            clauses.append("claimed_at_us < ?")
            params.append(_micros(filters.older_than))
        if filters.newer_than is not None:
            clauses.append("claimed_at_us >= ?")
            params.append(_micros(filters.newer_than))
        if after is not None:
            clauses.append("(claimed_at_us < ? OR (claimed_at_us = ? AND run_id < ?))")
            params.extend([_micros(after[0]), _micros(after[0]), after[1]])
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"{_SELECT}{where} ORDER BY claimed_at_us DESC, run_id DESC LIMIT ?"
        with self._guard("list runs"):
            rows = self._connection().execute(sql, [*params, limit]).fetchall()
        return [_decode(row) for row in rows]

    def _find_by_identity(self, name: str, value: str) -> list[RunRecord]:
        if name not in ("task_name", "job_name"):  # The two indexed identity fields.
            raise ValueError(f"runs are not looked up by {name!r}")
        sql = f"{_SELECT} WHERE json_extract(identity, '$.{name}') = ?"
        with self._guard("look runs up"):
            rows = self._connection().execute(sql, (value,)).fetchall()
        return [_decode(row) for row in rows]

    def purge_expired(self, now: datetime) -> int:
        def work(connection: sqlite3.Connection) -> int:
            moment = (_micros(now),)
            purged = connection.execute("DELETE FROM runs WHERE expire_at_us <= ?", moment).rowcount
            return purged + locks.purge(connection, now)

        purged: int = self._batches.get().run(work)
        return purged + self.purge_delivery_counts(now - TALLY_KEPT)

    def close(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None
        writing = self._writing.made_here()
        if writing is not None:
            writing.close()
        self._writing.forget()
        self._writer_lock.close()

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
        private_files.prepare_private_database(self.path, wal.start_in_wal_mode)
        timeout = self._busy_timeout.total_seconds()
        # isolation_level=None: we issue BEGIN/COMMIT ourselves.
        connection = sqlite3.connect(
            self.path, timeout=timeout, isolation_level=None, check_same_thread=False
        )
        try:
            connection.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            connection.execute("PRAGMA synchronous = FULL")
            self._ensure_schema(connection)
            private_files.check_private_database(self.path)  # What SQLite opened, too.
        except BaseException:
            connection.close()
            raise
        return connection

    def _ensure_schema(self, connection: sqlite3.Connection) -> None:
        with self._schema_lock:
            if self._schema_ready_pid == os.getpid():
                return
            wal.use_wal(connection, self.path, self._busy_timeout)
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
                _add_missing_columns(connection)
                connection.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
                connection.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise
            self._schema_ready_pid = os.getpid()

    @contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        """Turn any SQLite or file-system error into :class:`StoreUnavailable`."""
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"SQLite store {self.path}: could not {action}: {exc}") from exc


def _add_missing_columns(connection: sqlite3.Connection) -> None:
    present = {row[1] for row in connection.execute("PRAGMA table_info(runs)")}
    for name, kind in _ADDED_COLUMNS.items():
        if name not in present:  # Constant names and types only: nothing from outside.
            connection.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")


def _write(
    connection: sqlite3.Connection, old: tuple[Any, ...] | None, new: tuple[Any, ...]
) -> None:
    """Insert a new record, or update an existing one's state in place."""
    if old is None:
        connection.execute(_INSERT, new)
    elif all(old[index] == new[index] for index in _IDENTITY_AT):
        connection.execute(_UPDATE, [*(new[index] for index in _STATE_AT), new[0]])
    else:  # Never for records this store wrote; kept correct for any other writer's.
        connection.execute("DELETE FROM runs WHERE run_id = ?", (new[0],))
        connection.execute(_INSERT, new)


def _encode(record: RunRecord) -> tuple[Any, ...]:
    return tuple(_CODEC.encode(record))


def _decode(row: tuple[Any, ...]) -> RunRecord:
    return _CODEC.decode(row)
