"""The SQLite store's file: its connections, its writers' turns and its group commit.

Reads run on a connection per thread and per process (connections never cross a fork).
Changes go through the process's one writing connection, in batches (group commit), under
the cross-process writer lock (see :mod:`tasklease.worker.stores.sqlite.store`). The file is
made private and put in WAL mode, and its schema made, on first open.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from tasklease.errors import StoreUnavailable
from tasklease.plumbing import private_files
from tasklease.plumbing.group_commit import ChangeBatcher, Pending
from tasklease.plumbing.per_process import PerProcess
from tasklease.plumbing.writer_lock import WriterLock, WriterLockTimeout
from tasklease.worker.stores.sqlite import schema, wal

__all__ = ["SqliteDatabase"]

_T = TypeVar("_T")


class SqliteDatabase:
    """One SQLite file at ``path``, opened lazily: a worker starts while the file is
    unreachable, and each use raises StoreUnavailable until it is back."""

    def __init__(self, path: Path, busy_timeout: timedelta) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._schema_ready_pid: int | None = None
        self._schema_lock = threading.Lock()
        # A child must not inherit a batch in flight at fork: each process groups its own.
        self._batches = PerProcess(lambda: ChangeBatcher(self._commit_batch))
        # The one connection this process's batches write through (one batch at a time).
        # SQLite empties a connection's page cache whenever another connection changed the
        # file, so a batch on a per-thread connection would reread its pages after every
        # other thread's commit; one writing connection per process keeps them.
        self._writing = PerProcess(self._open)
        self._writer_lock = WriterLock(
            Path(f"{path}.lock"), lambda: private_files.make_private_dirs(path.parent)
        )

    def change(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """``work`` in the write transaction of some batch of this process's changes; its
        value once that batch committed. ``work``'s own exception goes through (it wrote
        nothing); a failure of the batch raises StoreUnavailable."""
        value: _T = self._batches.get().run(work)
        return value

    def alone(self, action: Callable[[], _T]) -> _T:
        """``action`` on this thread while no batch of the process's changes is in flight
        (a transactional handler's transaction, on :meth:`writing`)."""
        return self._batches.get().alone(action)

    def writing(self) -> sqlite3.Connection:
        """The process's one writing connection; use it only inside :meth:`alone`."""
        return self._writing.get()

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (for reads, and writes in a transaction of their own)."""
        pid = os.getpid()
        if getattr(self._local, "pid", None) != pid or self._local.connection is None:
            self._local.connection = self._open()
            self._local.pid = pid
        connection: sqlite3.Connection = self._local.connection
        return connection

    @contextmanager
    def guard(self, action: str) -> Iterator[None]:
        """Turn any SQLite or file-system error into :class:`StoreUnavailable`."""
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"SQLite store {self.path}: could not {action}: {exc}") from exc

    @contextmanager
    def writer(self) -> Iterator[None]:
        """Hold the cross-process writer lock; a holder that hangs (stopped, stuck on a dead
        disk) costs a 503 after busy_timeout, as SQLite's own lock would."""
        try:
            with self._writer_lock.held(self.busy_timeout.total_seconds()):
                yield
        except WriterLockTimeout as exc:
            raise StoreUnavailable(f"SQLite store {self.path}: {exc}") from None

    def close(self) -> None:
        """Close this thread's and this process's connections, and the writer lock's file."""
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None
        writing = self._writing.made_here()
        if writing is not None:
            writing.close()
        self._writing.forget()
        self._writer_lock.close()

    def _commit_batch(self, batch: list[Pending[sqlite3.Connection]]) -> None:
        """Apply a batch of changes in one write transaction: one commit, one sync."""
        try:
            with self.guard("change a run"), self.writer():
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

    def _open(self) -> sqlite3.Connection:
        private_files.prepare_private_database(self.path, wal.start_in_wal_mode)
        timeout = self.busy_timeout.total_seconds()
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
            wal.use_wal(connection, self.path, self.busy_timeout)
            schema.migrate(connection, self.path)
            self._schema_ready_pid = os.getpid()
