"""The emulator's durable state: queues, tasks, name tombstones and the delivery log.

One SQLite file, one connection behind a lock (the emulator is one process). A restarted
emulator finds every queue, pending task and tombstone where it left them.

The hot writes, creating a task and recording a dispatch, go through a group commit
(:mod:`tasklease.plumbing.group_commit`): the changes that threads make at the same time
share one transaction and one commit, and each call returns only once its change is committed, so a
created task survives a crash as before. One transaction per change, as before, cost a commit
(and its WAL pages) per task twice over, and kept every other writer waiting on the lock.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tasklease.emulator.rows import (
    INSERT_DELIVERY,
    INSERT_TASK,
    RESCHEDULE,
    TASK_COLUMNS,
    DeliveryRecord,
    Finish,
    TaskRow,
    decode_task,
    delivery_values,
    encode_task,
)
from tasklease.plumbing.group_commit import ChangeBatcher, Pending
from tasklease.plumbing.private_files import check_private_database, prepare_private_database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY,
    config TEXT NOT NULL,
    created_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
    name TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    spec TEXT NOT NULL,
    schedule_us INTEGER NOT NULL,
    create_us INTEGER NOT NULL,
    dispatch_count INTEGER NOT NULL DEFAULT 0,
    response_count INTEGER NOT NULL DEFAULT 0,
    first_attempt TEXT,
    last_attempt TEXT,
    first_attempt_us INTEGER,
    previous_response INTEGER,
    retry_reason TEXT,
    in_flight INTEGER NOT NULL DEFAULT 0,
    execution_count INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS tasks_due ON tasks (queue, in_flight, schedule_us);
CREATE TABLE IF NOT EXISTS tombstones (
    name TEXT PRIMARY KEY,
    at_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS queue_tombstones (
    name TEXT PRIMARY KEY,
    at_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS scheduler_jobs (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS iam_policies (
    resource TEXT PRIMARY KEY,
    policy TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    queue TEXT,
    name TEXT NOT NULL,
    url TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    status INTEGER,
    outcome TEXT,
    fault TEXT,
    error TEXT,
    started_us INTEGER NOT NULL,
    duration_ms REAL NOT NULL
);
"""


class EmulatorDB:
    """All reads and writes of the emulator's state."""

    def __init__(self, path: Path) -> None:
        prepare_private_database(path)  # Task payloads and headers: owner-only, like the key.
        self._connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.RLock()
        with self._lock:
            self._connection.execute("PRAGMA journal_mode = WAL")
            check_private_database(path)
            self._connection.execute("PRAGMA synchronous = NORMAL")  # Durable across crashes.
            self._connection.executescript(_SCHEMA)
            columns = {row[1] for row in self._connection.execute("PRAGMA table_info(tasks)")}
            if "execution_count" not in columns:  # A database from before the column.
                self._connection.execute(
                    "ALTER TABLE tasks ADD COLUMN execution_count INTEGER NOT NULL DEFAULT 0"
                )
            # Dispatches cut short by a stop are retried after the restart.
            self._connection.execute("UPDATE tasks SET in_flight = 0 WHERE in_flight = 1")
            rows = self._connection.execute("SELECT name, config FROM queues").fetchall()
        # Queue configs are read on every create and dispatch pass, and only this object
        # writes them: keep them in memory too.
        self._queues: dict[str, dict[str, Any]] = {name: json.loads(c) for name, c in rows}
        # The in-memory configs have their own lock: reading them never waits for a commit.
        self._queues_lock = threading.Lock()
        self._writes: ChangeBatcher[sqlite3.Connection] = ChangeBatcher(self._commit_batch)

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._connection.execute("BEGIN IMMEDIATE")
            try:
                yield self._connection
            except BaseException:
                self._connection.execute("ROLLBACK")
                raise
            self._connection.execute("COMMIT")

    def _commit_batch(self, batch: list[Pending[sqlite3.Connection]]) -> None:
        """Apply a batch of changes in one transaction. A change's work is SQL only (its
        values are computed before), so an error is SQLite's and fails the whole batch."""
        with self.transaction() as connection:
            for pending in batch:
                pending.value = pending.work(connection)

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._connection.execute(sql, params).fetchall()

    # Queues.
    def put_queue(self, name: str, config: dict[str, Any], now_us: int) -> None:
        with self._lock:
            self._connection.execute(
                "INSERT INTO queues (name, config, created_us) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET config = excluded.config",
                (name, json.dumps(config), now_us),
            )
            with self._queues_lock:
                self._queues[name] = json.loads(json.dumps(config))

    def get_queue(self, name: str) -> dict[str, Any] | None:
        """A copy of the queue's config, to change and put back."""
        with self._queues_lock:
            config = self._queues.get(name)
            return json.loads(json.dumps(config)) if config is not None else None

    def has_queue(self, name: str) -> bool:
        with self._queues_lock:
            return name in self._queues

    def all_queues(self) -> list[dict[str, Any]]:
        """Every queue's config, not copied: read them, do not change them."""
        with self._queues_lock:
            return list(self._queues.values())

    def list_queues(self, parent: str) -> list[dict[str, Any]]:
        with self._queues_lock:
            names = sorted(n for n in self._queues if n.startswith(f"{parent}/queues/"))
        return [config for config in map(self.get_queue, names) if config is not None]

    def delete_queue(self, name: str, now_us: int) -> None:
        with self.transaction() as connection:
            _tombstone_where(connection, "queue = ?", (name,), now_us)
            connection.execute("DELETE FROM queues WHERE name = ?", (name,))
            connection.execute("DELETE FROM iam_policies WHERE resource = ?", (name,))
            connection.execute(
                "INSERT OR REPLACE INTO queue_tombstones (name, at_us) VALUES (?, ?)",
                (name, now_us),
            )
            with self._queues_lock:
                self._queues.pop(name, None)

    def queue_deleted_since(self, name: str, since_us: int) -> bool:
        return bool(
            self._query(
                "SELECT 1 FROM queue_tombstones WHERE name = ? AND at_us >= ?", (name, since_us)
            )
        )

    # Tasks.
    def insert_task(self, row: TaskRow, tombstones_since_us: int) -> bool:
        """Insert a new task; False if its name is taken (a task, or a tombstone since then).

        Committed (with whatever else is being written at the moment) before it returns.
        """
        params = (*encode_task(row), row.name, tombstones_since_us)

        def insert(connection: sqlite3.Connection) -> bool:
            try:
                return connection.execute(INSERT_TASK, params).rowcount == 1
            except sqlite3.IntegrityError:  # Only this statement is undone, not the batch.
                return False

        return bool(self._writes.run(insert))

    def insert_tasks(self, rows: Sequence[TaskRow], tombstones_since_us: int) -> list[bool]:
        """:meth:`insert_task` for each of ``rows``, in order, in one change: a batch of
        creates costs one commit. A name taken earlier in the same batch is taken too."""
        params = [(*encode_task(row), row.name, tombstones_since_us) for row in rows]

        def insert_all(connection: sqlite3.Connection) -> list[bool]:
            inserted = []
            for values in params:
                try:
                    inserted.append(connection.execute(INSERT_TASK, values).rowcount == 1)
                except sqlite3.IntegrityError:
                    inserted.append(False)
            return inserted

        return list(self._writes.run(insert_all))

    def task_tombstoned_since(self, name: str, since_us: int) -> bool:
        return bool(
            self._query("SELECT 1 FROM tombstones WHERE name = ? AND at_us >= ?", (name, since_us))
        )

    def get_task(self, name: str) -> TaskRow | None:
        rows = self._query(f"SELECT {TASK_COLUMNS} FROM tasks WHERE name = ?", (name,))  # noqa: S608
        return decode_task(rows[0]) if rows else None

    def list_tasks(self, queue: str, limit: int, offset: int) -> list[TaskRow]:
        rows = self._query(
            f"SELECT {TASK_COLUMNS} FROM tasks WHERE queue = ? "  # noqa: S608
            "ORDER BY schedule_us, name LIMIT ? OFFSET ?",
            (queue, limit, offset),
        )
        return [decode_task(row) for row in rows]

    def count_tasks(self, queue: str | None = None) -> int:
        if queue is None:
            return int(self._query("SELECT COUNT(*) FROM tasks")[0][0])
        return int(self._query("SELECT COUNT(*) FROM tasks WHERE queue = ?", (queue,))[0][0])

    def claim_due(self, queue: str, now_us: int, limit: int) -> list[TaskRow]:
        """Mark up to ``limit`` due tasks of ``queue`` in flight, earliest first; return them."""
        if limit <= 0:
            return []
        rows = self._query(
            f"UPDATE tasks SET in_flight = 1 WHERE name IN (SELECT name FROM tasks "  # noqa: S608
            "WHERE queue = ? AND in_flight = 0 AND schedule_us <= ? ORDER BY schedule_us LIMIT ?) "
            f"RETURNING {TASK_COLUMNS}",
            (queue, now_us, limit),
        )
        return sorted((decode_task(row) for row in rows), key=lambda row: row.schedule_us)

    def has_due(self, queue: str, now_us: int) -> bool:
        return bool(
            self._query(
                "SELECT 1 FROM tasks WHERE queue = ? AND in_flight = 0 AND schedule_us <= ? "
                "LIMIT 1",
                (queue, now_us),
            )
        )

    def next_schedule(self, queue: str) -> int | None:
        rows = self._query(
            "SELECT MIN(schedule_us) FROM tasks WHERE queue = ? AND in_flight = 0", (queue,)
        )
        upcoming: int | None = rows[0][0]
        return upcoming

    def claim_for_dispatch(self, name: str) -> TaskRow | None:
        """Mark a task in flight; None if it is gone or already in flight."""
        with self.transaction() as connection:
            row = connection.execute(
                f"SELECT {TASK_COLUMNS} FROM tasks WHERE name = ? AND in_flight = 0",  # noqa: S608
                (name,),
            ).fetchone()
            if row is None:
                return None
            connection.execute("UPDATE tasks SET in_flight = 1 WHERE name = ?", (name,))
            return decode_task(row)

    def finish_attempt(
        self,
        name: str,
        *,
        delete: bool,
        now_us: int,
        schedule_us: int,
        responded: bool,
        executed: bool = False,
        attempt: dict[str, Any],
        previous_response: int | None,
        retry_reason: str | None,
        deliveries: Sequence[DeliveryRecord] = (),
    ) -> None:
        """Record one dispatch (and its deliveries): the task is deleted (tombstoned) or
        rescheduled. Committed with whatever else is being written at the moment."""
        self.finish_attempts(
            [
                Finish(
                    name,
                    delete=delete,
                    now_us=now_us,
                    schedule_us=schedule_us,
                    responded=responded,
                    executed=executed,
                    attempt=attempt,
                    previous_response=previous_response,
                    retry_reason=retry_reason,
                    deliveries=deliveries,
                )
            ]
        )

    def finish_attempts(self, finishes: Sequence[Finish]) -> None:
        """:meth:`finish_attempt` for several dispatches, in one change."""
        changes = [_finish_change(finish) for finish in finishes]

        def finish_all(connection: sqlite3.Connection) -> None:
            for change in changes:
                change(connection)

        if changes:
            self._writes.run(finish_all)

    def delete_task(self, name: str, now_us: int) -> bool:
        with self.transaction() as connection:
            found = connection.execute("SELECT 1 FROM tasks WHERE name = ?", (name,)).fetchone()
            if found:
                _tombstone_where(connection, "name = ?", (name,), now_us)
            return bool(found)

    def purge_queue(self, queue: str, now_us: int) -> None:
        with self.transaction() as connection:
            _tombstone_where(connection, "queue = ? AND in_flight = 0", (queue,), now_us)

    def forget_tombstones(self, before_us: int) -> None:
        with self._lock:
            self._connection.execute("DELETE FROM tombstones WHERE at_us < ?", (before_us,))

    # IAM policies of queues (REST JSON).
    def get_policy(self, resource: str) -> dict[str, Any] | None:
        rows = self._query("SELECT policy FROM iam_policies WHERE resource = ?", (resource,))
        return json.loads(rows[0][0]) if rows else None

    def put_policy(self, resource: str, policy: dict[str, Any]) -> None:
        with self._lock:
            self._connection.execute(
                "INSERT OR REPLACE INTO iam_policies (resource, policy) VALUES (?, ?)",
                (resource, json.dumps(policy)),
            )

    # Deliveries.
    def log_delivery(self, record: DeliveryRecord) -> None:
        with self._lock:
            self._insert_delivery(self._connection, record)

    @staticmethod
    def _insert_delivery(connection: sqlite3.Connection, record: DeliveryRecord) -> None:
        connection.execute(INSERT_DELIVERY, delivery_values(record))

    def deliveries(self, queue: str | None = None) -> list[DeliveryRecord]:
        sql = (
            "SELECT kind, queue, name, url, attempt, status, outcome, fault, error, started_us, "
            "duration_ms FROM deliveries"
        )
        rows = (
            self._query(sql + " WHERE queue = ? ORDER BY id", (queue,))
            if queue
            else self._query(sql + " ORDER BY id")
        )
        return [DeliveryRecord(*row) for row in rows]


def _tombstone_where(
    connection: sqlite3.Connection, where: str, params: tuple[Any, ...], now_us: int
) -> None:
    """Delete the tasks ``where`` selects, keeping a tombstone of each name."""
    # ``where`` is one of this module's constants.
    insert = (
        f"INSERT OR REPLACE INTO tombstones (name, at_us) SELECT name, ? FROM tasks WHERE {where}"  # noqa: S608
    )
    connection.execute(insert, (now_us, *params))
    connection.execute(f"DELETE FROM tasks WHERE {where}", params)  # noqa: S608


def _finish_change(finish: Finish) -> Callable[[sqlite3.Connection], None]:
    """The SQL of one finished dispatch, its values computed now (outside the batch)."""
    logged = [delivery_values(record) for record in finish.deliveries]
    name, now_us = finish.name, finish.now_us
    stored = None if finish.delete else json.dumps(finish.attempt)
    update = (
        *(finish.schedule_us, int(finish.responded), int(finish.executed), stored, stored),
        *(now_us, finish.previous_response, finish.retry_reason, name),
    )

    def change(connection: sqlite3.Connection) -> None:
        if logged:
            connection.executemany(INSERT_DELIVERY, logged)
        if finish.delete:
            _tombstone_where(connection, "name = ?", (name,), now_us)
        else:
            connection.execute(RESCHEDULE, update)

    return change
