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

import logging
import os
import sqlite3
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from tasklease.errors import StoreUnavailable
from tasklease.joins import Member
from tasklease.worker.core.fan_in import ChildEntry, FanInRecord, Progress
from tasklease.worker.core.queries import Position, RunFilter
from tasklease.worker.core.records import Claim, ClaimRequest, LockRecord, RunRecord, RunStatus
from tasklease.worker.stores.base.fan_ins import FanInStore, count_member_in
from tasklease.worker.stores.base.locks import LockStore
from tasklease.worker.stores.base.queries import OperatorQueries
from tasklease.worker.stores.base.store import Change, LockChange, Moment, resolve
from tasklease.worker.stores.base.tally import TALLY_KEPT, DeliveryTally, MinuteCounts, TallyKey
from tasklease.worker.stores.base.transactional import (
    StepWork,
    TransactionalStore,
    TransactionOutcome,
    Work,
)
from tasklease.worker.stores.sqlite import fan_ins, locks, schema
from tasklease.worker.stores.sqlite.database import SqliteDatabase
from tasklease.worker.stores.sqlite.locks import micros as _micros
from tasklease.worker.stores.sqlite.tally import SqliteTally
from tasklease.worker.stores.sqlite.transactions import SqliteTransactions

_T = TypeVar("_T")
_log = logging.getLogger("tasklease.store")


class SqliteStore(LockStore, FanInStore, OperatorQueries, DeliveryTally, TransactionalStore):
    """Run records in a SQLite file at ``path`` (created 0600, with any missing folder 0700,
    on first use: records hold payloads and errors).

    The file is opened lazily, per thread and per process (connections never cross a fork),
    so a worker starts even while the file is unreachable and answers 503 until it is back.
    Records past ``expire_at`` are purged every ``purge_interval`` by the process that claims.
    Its delivery tally and its transactions are collaborators on the same file
    (:attr:`tally`, :attr:`transactions`).
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
        self._database = SqliteDatabase(self.path, busy_timeout)
        self.tally = SqliteTally(self._database)
        self.transactions = SqliteTransactions(self._database)
        self._purge_interval = purge_interval.total_seconds()
        self._next_purge = 0.0

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def claim(self, request: ClaimRequest, now: Moment) -> Claim:
        outcome = super().claim(request, now)
        self._purge_now_and_then(resolve(now))
        return outcome

    def _read_modify_write(self, run_id: str, change: Change[_T]) -> _T:
        def work(connection: sqlite3.Connection) -> _T:
            row = schema.read_row(connection, run_id)
            new_record, value = change(schema.decode_run(row) if row else None)
            if new_record is not None:
                try:
                    schema.write_run(connection, row, new_record)
                except (UnicodeError, OverflowError) as exc:  # The contract: nothing else.
                    raise StoreUnavailable(f"SQLite store: cannot store the record: {exc}") from exc
            return value

        return self._database.change(work)

    def _read_modify_write_member(
        self, run_id: str, member: Member, change: Change[_T], now: Moment, keep_for: timedelta
    ) -> tuple[_T, Progress]:
        def work(connection: sqlite3.Connection) -> tuple[_T, Progress]:
            row = schema.read_row(connection, run_id)
            stored = schema.decode_run(row) if row else None
            new_record, value = change(stored)
            if new_record is not None:
                try:
                    schema.write_run(connection, row, new_record)
                except (UnicodeError, OverflowError) as exc:
                    raise StoreUnavailable(f"SQLite store: cannot store the record: {exc}") from exc
            after = new_record if new_record is not None else stored
            rows = fan_ins.Rows(connection)
            return value, count_member_in(rows, after, member, resolve(now), keep_for)

        return self._database.change(work)

    def get_fan_in(self, join_id: str) -> FanInRecord | None:
        with self._database.guard("read a fan-in"):
            return fan_ins.get(self._database.connection(), join_id)

    def fan_in_entries(
        self, join_id: str, after: str | None = None, limit: int = 1000
    ) -> list[ChildEntry]:
        with self._database.guard("read a fan-in's entries"):
            return fan_ins.entries(self._database.connection(), join_id, after, limit)

    def fan_ins_of(self, parent_run_id: str, limit: int = 100) -> list[FanInRecord]:
        with self._database.guard("list a run's fan-ins"):
            return fan_ins.of_parent(self._database.connection(), parent_run_id, limit)

    def mark_then_enqueued(self, join_id: str, now: datetime) -> None:
        self._database.change(lambda c: fan_ins.mark_then_enqueued(c, join_id, now))

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
        database file (see :mod:`.transactions`)."""
        return self.transactions.complete(run_id, attempt_id, work, now, keep_for=keep_for)

    def record_step_in_transaction(
        self, run_id: str, attempt_id: str, step_work: StepWork, now: Moment
    ) -> TransactionOutcome:
        """The step's transaction is a transactional handler's: see above."""
        return self.transactions.record_step(run_id, attempt_id, step_work)

    def write_delivery_counts(self, instance: str, counts: MinuteCounts) -> None:
        self.tally.write(instance, counts)

    def delivery_counts(self, since: datetime) -> dict[datetime, Counter[TallyKey]]:
        return self.tally.read(since)

    def purge_delivery_counts(self, before: datetime) -> int:
        return self.tally.purge(before)

    def _read_modify_write_lock(self, name: str, change: LockChange[_T]) -> _T:
        def work(connection: sqlite3.Connection) -> _T:
            def read(run_id: str) -> RunRecord | None:  # In the same write transaction.
                row = schema.read_row(connection, run_id)
                return schema.decode_run(row) if row else None

            new_lock, value = change(locks.read(connection, name), read)
            if new_lock is not None:
                locks.write(connection, new_lock)
            return value

        return self._database.change(work)

    def get_lock(self, name: str) -> LockRecord | None:
        with self._database.guard("read a lock"):
            return locks.read(self._database.connection(), name)

    def list_locks(self, limit: int = 100) -> list[LockRecord]:
        with self._database.guard("list locks"):
            return locks.listed(self._database.connection(), limit)

    def get(self, run_id: str) -> RunRecord | None:
        with self._database.guard("read a run"):
            row = schema.read_row(self._database.connection(), run_id)
        return schema.decode_run(row) if row else None

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        where, params = (" WHERE status = ?", [status.value]) if status else ("", [])
        sql = schema.SELECT + where + " ORDER BY claimed_at_us DESC LIMIT ?"
        return self._rows(sql, [*params, limit], "list runs")

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
        sql = f"{schema.SELECT}{where} ORDER BY claimed_at_us DESC, run_id DESC LIMIT ?"
        return self._rows(sql, [*params, limit], "list runs")

    def _find_by_identity(self, name: str, value: str) -> list[RunRecord]:
        if name not in ("task_name", "job_name"):  # The two indexed identity fields.
            raise ValueError(f"runs are not looked up by {name!r}")
        sql = f"{schema.SELECT} WHERE json_extract(identity, '$.{name}') = ?"
        return self._rows(sql, [value], "look runs up")

    def _rows(self, sql: str, params: list[Any], action: str) -> list[RunRecord]:
        with self._database.guard(action):
            rows = self._database.connection().execute(sql, params).fetchall()
        return [schema.decode_run(row) for row in rows]

    def purge_expired(self, now: datetime) -> int:
        def work(connection: sqlite3.Connection) -> int:
            moment = (_micros(now),)
            purged = connection.execute("DELETE FROM runs WHERE expire_at_us <= ?", moment).rowcount
            return purged + locks.purge(connection, now) + fan_ins.purge(connection, now)

        purged = self._database.change(work)
        return purged + self.purge_delivery_counts(now - TALLY_KEPT)

    def close(self) -> None:
        self._database.close()

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
