"""A store in Cloud Spanner: one row per run, changed in read-write transactions.

RPCs (the client uses a multiplexed session and begins each read-write transaction inline
with its first read, so a transaction costs its reads plus the Commit):

- a first claim: one Commit of an ``insert`` mutation in a single-use transaction, which
  Spanner refuses with ALREADY_EXISTS when the run has a row. 1 RPC.
- a claim that finds a row: one strong read decides a duplicate (2 RPCs with the refused
  insert); a takeover then runs the rules again in a read-write transaction (4 RPCs).
- renew, complete, fail, release, locks, operators' changes: a read-write transaction that
  reads the row, applies the rules and writes. 2 RPCs.
- a retried delivery's first read (the executor's ``get``): one strong read. 1 RPC.
- a transactional handler's completion: one read-write transaction holding the handler's
  statements too (:mod:`.transactions`). 2 RPCs beyond the handler's own.
- a fan-in child's finish (or its recount): one read-write transaction that reads the run's
  row, reads its join with its entry in one query, and writes the row, the entry and the
  join's counts (:mod:`.fan_ins`). 3 RPCs.
- on Google's emulator, a renewal made while the attempt's own handler or step transaction
  is open: one strong read, which confirms the lease as stored (:meth:`SpannerStore.renew`).

Spanner may run a transaction function again (ABORTED under contention): the function only
reads, applies a pure rule and buffers mutations, and reads its :data:`Moment` inside, so a
re-run decides afresh from what it reads. Every read is strong: a retry answered from a stale
row would take a finished run for a running one, and each contract test reads its own writes.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from contextlib import suppress
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar

from google.api_core import exceptions as api
from google.cloud import spanner
from google.cloud.spanner_v1.client import EMULATOR_ENV_VAR

from tasklease.errors import ConfigurationError, StoreUnavailable
from tasklease.joins import Member
from tasklease.plumbing.spanner_calls import bound_calls, guard, run_transaction
from tasklease.worker.core import decisions, locking
from tasklease.worker.core.fan_in import ChildEntry, FanInRecord, Progress
from tasklease.worker.core.queries import Position, RunFilter
from tasklease.worker.core.records import (
    Claim,
    ClaimRequest,
    LockRecord,
    RunRecord,
    RunStatus,
    Verdict,
)
from tasklease.worker.stores.base.fan_ins import FanInStore, count_member_in
from tasklease.worker.stores.base.locks import LockStore
from tasklease.worker.stores.base.orphans import OrphanClaims, orphan_released
from tasklease.worker.stores.base.queries import OperatorQueries
from tasklease.worker.stores.base.store import Change, LockChange, Moment, resolve
from tasklease.worker.stores.base.tally import TALLY_KEPT, DeliveryTally, MinuteCounts, TallyKey
from tasklease.worker.stores.base.transactional import (
    StepWork,
    TransactionalStore,
    TransactionOutcome,
    Work,
)
from tasklease.worker.stores.spanner import fan_ins, schema
from tasklease.worker.stores.spanner.runs import SpannerRuns, key_set
from tasklease.worker.stores.spanner.tally import SpannerTally
from tasklease.worker.stores.spanner.transactions import SpannerTransactions

_T = TypeVar("_T")

DEFAULT_TABLE = "tasklease_runs"
# Rows deleted per statement by purge_expired (the row deletion policy does it in production).
PURGE_BATCH = 500
# Errors after which a write may have landed: the server may have committed it before the call
# failed (RetryError: the client's retries ran out of time, the last one such an error).
_UNCERTAIN = (
    api.DeadlineExceeded,
    api.ServiceUnavailable,
    api.InternalServerError,
    api.Unknown,
    api.Cancelled,
    api.RetryError,
)
_P = spanner.param_types
log = logging.getLogger("tasklease.store.spanner")
_RUNS = ", ".join(schema.RUN_COLUMNS)
_LOCKS = ", ".join(schema.LOCK_COLUMNS)


class SpannerStore(TransactionalStore, LockStore, FanInStore, OperatorQueries, DeliveryTally):
    """Run records in ``table`` (locks in ``<table>_locks``, joins in ``<table>_fan_ins``) of
    the Spanner database ``projects/P/instances/I/databases/D``.

    Its run rows, joins, delivery tally and transactions are collaborators on the same
    database (:attr:`runs`, :attr:`fan_ins`, :attr:`tally`, :attr:`transactions`).

    The database must exist; the tables, indexes and row deletion policies are created on
    first use when missing (:meth:`create_schema`). The client is created lazily per process
    (gRPC channels must not cross a fork). ``call_timeout`` bounds each store call, the
    client's own retries included, so an outage answers 503 in seconds.
    """

    DEFAULT_TABLE: ClassVar[str] = DEFAULT_TABLE
    DEFAULT_CALL_TIMEOUT: ClassVar[float] = 10.0
    transaction_reruns: ClassVar[bool] = True  # Spanner runs an aborted transaction again.

    def __init__(
        self,
        database: str,
        table: str = DEFAULT_TABLE,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        create_schema: bool = True,
    ) -> None:
        parts = database.split("/")
        if len(parts) != 6 or parts[0::2] != ["projects", "instances", "databases"]:
            raise ConfigurationError(
                f"Spanner database {database!r}: use projects/P/instances/I/databases/D"
            )
        if not table.replace("_", "").isalnum() or not table[0].isalpha():
            raise ConfigurationError(f"Spanner table {table!r}: letters, digits and _ only")
        self.database_path = database
        self.table = table
        self.lock_table = f"{table}_locks"
        self._project, self._instance, self._database_id = parts[1::2]
        self._timeout = call_timeout
        self._create_schema = create_schema
        self._lock = threading.Lock()
        self._database: Any = None
        self._pid: int | None = None
        # Whether the client talks to Google's emulator (it reads the same variable).
        self._on_emulator = False
        self.runs = SpannerRuns(lambda: self.database, table)
        self.fan_ins = fan_ins.SpannerFanIns(lambda: self.database, table, call_timeout)
        self.tally = SpannerTally(lambda: self.database, table, call_timeout)
        self.transactions = SpannerTransactions(lambda: self.database, self.runs)
        self._schema_ready_pid: int | None = None
        # Claims whose write may have landed though the claim failed: given back on the next
        # claim of their run, or by a background retry.
        self._orphans = OrphanClaims(self._give_back_orphan, log)

    def __repr__(self) -> str:
        return f"SpannerStore({self.database_path!r}, table={self.table!r})"

    @property
    def database(self) -> Any:
        """This process's ``spanner.Database``, its schema ready."""
        if self._database is None or self._pid != os.getpid():
            with self._lock:
                if self._database is None or self._pid != os.getpid():
                    with guard("connect"):
                        client = spanner.Client(project=self._project)
                        self._on_emulator = bool(os.environ.get(EMULATOR_ENV_VAR))
                        instance = client.instance(self._instance)  # type: ignore[no-untyped-call]
                        database = instance.database(self._database_id)
                        bound_calls(database, self._timeout)
                    self._database, self._pid = database, os.getpid()
                    self._orphans.forget_all()  # The parent process still owns them.
        if self._schema_ready_pid != self._pid:
            self._ensure_schema(self._database)
        return self._database

    def create_schema(self) -> None:
        """Create the tables, indexes and row deletion policies that are missing (a no-op
        when all are there; safe to run from several processes at once)."""
        self._ensure_schema(self.database if self._database is None else self._database, True)

    def _ensure_schema(self, database: Any, force: bool = False) -> None:
        with self._lock:
            if self._schema_ready_pid == os.getpid() and not force:
                return
            with guard("check the schema"):
                if self._missing_objects(database):
                    if not (self._create_schema or force):
                        raise StoreUnavailable(
                            f"Spanner store: {self.table} or its indexes are missing in "
                            f"{self.database_path}: run SpannerStore.create_schema()"
                        )
                    try:
                        database.update_ddl(schema.ddl(self.table)).result(self._timeout * 6)
                    except api.GoogleAPICallError:
                        if self._missing_objects(database):  # Not a concurrent creation.
                            raise
                self._add_missing_columns(database)
            self._schema_ready_pid = os.getpid()

    def _add_missing_columns(self, database: Any) -> None:
        """Migrate a table created by an older tasklease: add the columns it lacks."""
        statements = schema.added_columns_ddl(self.table, self._columns(database))
        if not statements:
            return
        try:
            database.update_ddl(statements).result(self._timeout * 6)
        except api.GoogleAPICallError:
            # Not a concurrent migration: the columns are still missing.
            if schema.added_columns_ddl(self.table, self._columns(database)):
                raise

    def _columns(self, database: Any) -> set[str]:
        sql = (
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = '' AND table_name = @table"
        )
        with database.snapshot() as snapshot:
            rows = snapshot.execute_sql(
                sql, params={"table": self.table}, param_types={"table": spanner.param_types.STRING}
            )
            return {row[0] for row in rows}

    def _missing_objects(self, database: Any) -> set[str]:
        sql = (
            "SELECT table_name FROM information_schema.tables WHERE table_schema = '' "
            "UNION ALL SELECT index_name FROM information_schema.indexes "
            "WHERE table_schema = '' AND index_type = 'INDEX'"
        )
        with database.snapshot() as snapshot:
            present = {row[0] for row in snapshot.execute_sql(sql)}
        return schema.objects(self.table) - present

    # --- Runs ----------------------------------------------------------------------

    def claim(self, request: ClaimRequest, now: Moment) -> Claim:
        # The retry of a delivery whose claim landed unseen: give that claim back first.
        self._orphans.release(request.run_id)
        database = self.database
        fresh = decisions.claim(None, request, resolve(now))
        uncertain: Exception | None = None
        with guard("claim a run"):
            try:
                with database.batch(timeout_secs=self._timeout) as batch:
                    self.runs.insert(batch, fresh.record)
                return fresh
            except api.AlreadyExists:
                pass  # Another attempt's row, or our own first try retried by the client.
            except _UNCERTAIN as exc:
                uncertain = exc
            try:
                record = self._get(database, request.run_id)
            except _UNCERTAIN:
                if uncertain is not None:
                    self._orphans.note(fresh.record)
                raise
        if decisions.holds(record, request.attempt_id):
            assert record is not None
            return Claim(Verdict.CLAIMED, record)  # Our insert landed, its answer was lost.
        decided = decisions.claim(record, request, resolve(now))
        if decided.verdict is not Verdict.CLAIMED:
            return decided  # A duplicate, decided by one strong read: nothing to write.

        def change(stored: RunRecord | None) -> tuple[RunRecord | None, Claim]:
            if decisions.holds(stored, request.attempt_id):
                assert stored is not None
                return None, Claim(Verdict.CLAIMED, stored)
            outcome = decisions.claim(stored, request, resolve(now))
            return (outcome.record if outcome.record is not stored else None), outcome

        try:
            return self._read_modify_write(request.run_id, change)
        except StoreUnavailable as exc:
            if isinstance(exc.__cause__, _UNCERTAIN):
                self._orphans.note(decided.record)  # Its commit may have landed.
            raise

    def _give_back_orphan(
        self, run_id: str, attempt_id: str, claimed_at: datetime
    ) -> RunRecord | None:
        return self._if_held(run_id, attempt_id, orphan_released, claimed_at, RunStatus.RELEASED)

    def _read_modify_write(self, run_id: str, change: Change[_T]) -> _T:
        def work(transaction: Any) -> _T:
            record, value = change(self.runs.read(transaction, run_id))
            if record is not None:
                self.runs.write(transaction, record)
            return value

        database = self.database
        with guard("change a run"):
            return run_transaction(database, work, self._timeout, f"change run {run_id}")

    def renew_run(
        self,
        run_id: str,
        attempt_id: str,
        lease: timedelta,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> RunRecord | None:
        """Extend the lease (see :meth:`LeaseStore.renew_run`). On Google's emulator, while the
        attempt's own handler or step transaction is open, only confirm the lease stored: the
        emulator's one read-write transaction at a time would abort the handler's
        (:class:`.transactions.OpenTransactions`). Its lease is then not extended, so
        it may lapse before the handler ends; the handler's commit stays fenced by the row."""
        if self._runs_one_transaction_at_a_time() and self.transactions.is_open(attempt_id):
            record = self.get(run_id)
            if record is None or not decisions.holds(record, attempt_id):
                return None
            return record
        return super().renew_run(run_id, attempt_id, lease, now, keep_for=keep_for)

    def renew_lock(
        self, name: str, attempt_id: str, lease: timedelta, now: Moment
    ) -> datetime | None:
        """Extend the holder's lease on the lock; on Google's emulator, while the holder's
        transaction is open, only confirm the lease stored (as :meth:`renew` does)."""
        if self._runs_one_transaction_at_a_time() and self.transactions.is_open(attempt_id):
            lock = self.get_lock(name)
            if lock is None or not locking.holds(lock, attempt_id):
                return None
            return lock.lease_expires
        return super().renew_lock(name, attempt_id, lease, now)

    def _runs_one_transaction_at_a_time(self) -> bool:
        """Whether the database is Google's emulator, which aborts concurrent read-write
        transactions (connecting first: the client decides when it is created)."""
        return self.database is not None and self._on_emulator

    def complete_in_transaction(
        self,
        run_id: str,
        attempt_id: str,
        work: Work,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> TransactionOutcome:
        """``work`` gets the read-write ``Transaction`` (see :mod:`.transactions`)."""
        return self.transactions.complete(run_id, attempt_id, work, now, keep_for=keep_for)

    def record_step_in_transaction(
        self, run_id: str, attempt_id: str, step_work: StepWork, now: Moment
    ) -> TransactionOutcome:
        """The step's function gets the ``Transaction`` a transactional handler would."""
        return self.transactions.record_step(run_id, attempt_id, step_work)

    def write_delivery_counts(self, instance: str, counts: MinuteCounts) -> None:
        self.tally.write(instance, counts)

    def delivery_counts(self, since: datetime) -> dict[datetime, Counter[TallyKey]]:
        return self.tally.read(since)

    def purge_delivery_counts(self, before: datetime) -> int:
        return self.tally.purge(before)

    def get(self, run_id: str) -> RunRecord | None:
        return self.runs.get(run_id)

    def _get(self, database: Any, run_id: str) -> RunRecord | None:
        """One run's row by a strong single-use read (one RPC)."""
        with database.snapshot() as snapshot:
            return self.runs.read(snapshot, run_id)

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        where = "WHERE status = @status " if status is not None else ""
        sql = f"SELECT {_RUNS} FROM {self.table} {where}ORDER BY claimed_at DESC LIMIT @limit"  # noqa: S608
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = status.value
        return [schema.decode_run(row) for row in self._query(sql, params, "list runs")]

    def _scan_runs(self, filters: RunFilter, after: Position | None, limit: int) -> list[RunRecord]:
        """Every filter the columns hold, with the claimed_at range and order (the status and
        handler indexes serve those filters); the caller applies all of them again."""
        clauses: list[str] = []
        params: dict[str, Any] = {"limit": limit}
        status = filters.status_to_scan
        for column, value in (
            ("status", status.value if status else None),
            ("handler", filters.handler),
            ("kind", filters.kind),
        ):
            if value is not None:
                clauses.append(f"{column} = @{column}")
                params[column] = value
        if filters.older_than is not None:
            clauses.append("claimed_at < @older_than")
            params["older_than"] = filters.older_than
        if filters.newer_than is not None:
            clauses.append("claimed_at >= @newer_than")
            params["newer_than"] = filters.newer_than
        if after is not None:
            clauses.append(
                "(claimed_at < @after_at OR (claimed_at = @after_at AND run_id < @after_id))"
            )
            params.update(after_at=after[0], after_id=after[1])
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        order = "ORDER BY claimed_at DESC, run_id DESC LIMIT @limit"
        sql = f"SELECT {_RUNS} FROM {self.table} {where}{order}"  # noqa: S608
        return [schema.decode_run(row) for row in self._query(sql, params, "list runs")]

    def _find_by_identity(self, name: str, value: str) -> list[RunRecord]:
        if name not in ("task_name", "job_name"):  # The two indexed identity fields.
            raise ValueError(f"runs are not looked up by {name!r}")
        sql = f"SELECT {_RUNS} FROM {self.table} WHERE {name} = @value"  # noqa: S608
        return [schema.decode_run(row) for row in self._query(sql, {"value": value}, "look up")]

    def purge_expired(self, now: datetime) -> int:
        """Delete expired runs, lapsed locks and expired joins (their entries with them) now,
        in bounded batches (in production the row deletion policies do this by themselves)."""
        return (
            self._purge(self.table, "run_id", "expire_at", now)
            + self._purge(self.lock_table, "lock_id", "lapses_at", now)
            + self._purge(self.fan_ins.table, "join_id", "expire_at", now)
            + self.purge_delivery_counts(now - TALLY_KEPT)
        )

    def _purge(self, table: str, key: str, column: str, now: datetime) -> int:
        # Each statement deletes only rows expired as it runs, in its own transaction: a
        # takeover committed before it makes the row live again and it stays.
        sql = (
            f"DELETE FROM {table} WHERE {key} IN "  # noqa: S608 - constant names only.
            f"(SELECT {key} FROM {table} WHERE {column} <= @now LIMIT {PURGE_BATCH})"
        )
        purged = 0
        database = self.database
        with guard("purge expired rows"):
            while True:
                deleted: int = run_transaction(
                    database,
                    lambda transaction: transaction.execute_update(
                        sql, params={"now": now}, param_types={"now": _P.TIMESTAMP}
                    ),
                    self._timeout,
                    "purge expired rows",
                )
                purged += deleted
                if deleted < PURGE_BATCH:
                    return purged

    # --- Locks ---------------------------------------------------------------------

    def _read_modify_write_lock(self, name: str, change: LockChange[_T]) -> _T:
        """The lock's row and, when the rules ask, its holder's run, read in the same
        read-write transaction as the lock's write."""

        def work(transaction: Any) -> _T:
            lock, value = change(
                self._get_lock(transaction, name),
                lambda run_id: self.runs.read(transaction, run_id),
            )
            if lock is not None:
                row = schema.encode_lock(lock, spanner.COMMIT_TIMESTAMP)
                transaction.insert_or_update(self.lock_table, schema.LOCK_WRITE_COLUMNS, [row])
            return value

        database = self.database
        with guard("change a lock"):
            return run_transaction(database, work, self._timeout, f"change lock {name}")

    def get_lock(self, name: str) -> LockRecord | None:
        database = self.database
        with guard("read a lock"), database.snapshot() as snapshot:
            return self._get_lock(snapshot, name)

    def _get_lock(self, reader: Any, name: str) -> LockRecord | None:
        keys = key_set([locking.lock_id(name)])
        rows = list(reader.read(self.lock_table, schema.LOCK_COLUMNS, keys))
        return schema.decode_lock(rows[0]) if rows else None

    def list_locks(self, limit: int = 100) -> list[LockRecord]:
        order = "ORDER BY started_at DESC, name DESC LIMIT @limit"
        sql = f"SELECT {_LOCKS} FROM {self.lock_table} {order}"  # noqa: S608
        return [schema.decode_lock(row) for row in self._query(sql, {"limit": limit}, "list locks")]

    # --- Fan-ins -------------------------------------------------------------------

    def _read_modify_write_member(
        self, run_id: str, member: Member, change: Change[_T], now: Moment, keep_for: timedelta
    ) -> tuple[_T, Progress]:
        """The run's change and the child's count in one read-write transaction: an abort
        runs both again from their reads, the clock read afresh."""

        def work(transaction: Any) -> tuple[_T, Progress]:
            stored = self.runs.read(transaction, run_id)
            record, value = change(stored)
            if record is not None:
                self.runs.write(transaction, record)
            rows = fan_ins.SpannerJoinRows(transaction, self.table, member.key)
            after = record if record is not None else stored
            progress = count_member_in(rows, after, member, resolve(now), keep_for)
            rows.flush()
            return value, progress

        database = self.database
        with guard("count a fan-in child"):
            return run_transaction(database, work, self._timeout, f"count run {run_id}")

    def get_fan_in(self, join_id: str) -> FanInRecord | None:
        return self.fan_ins.get(join_id)

    def fan_in_entries(
        self, join_id: str, after: str | None = None, limit: int = 1000
    ) -> list[ChildEntry]:
        return self.fan_ins.entries(join_id, after, limit)

    def fan_ins_of(self, parent_run_id: str, limit: int = 100) -> list[FanInRecord]:
        return self.fan_ins.of_parent(parent_run_id, limit)

    def mark_then_enqueued(self, join_id: str, now: datetime) -> None:
        self.fan_ins.mark_then_enqueued(join_id, now)

    # --- Plumbing --------------------------------------------------------------------

    def _query(self, sql: str, params: dict[str, Any], action: str) -> list[list[Any]]:
        """All rows of one strong query (one RPC for a result of one stream)."""
        types = {name: _param_type(value) for name, value in params.items()}
        database = self.database
        with guard(action), database.snapshot() as snapshot:
            return list(snapshot.execute_sql(sql, params=params, param_types=types))

    def close(self) -> None:
        self._orphans.close()
        database, self._database = self._database, None
        if database is not None and self._pid == os.getpid():
            # Not database.close(): it joins the multiplexed session's refresher, which
            # sleeps 10 minutes between looks at its stop flag (database_sessions_manager.py,
            # google-cloud-spanner 3.71). That daemon thread ends once the database is
            # collected, and the session expires by itself; the channel is closed here.
            with suppress(api.GoogleAPIError, OSError, ValueError, AttributeError):
                database.spanner_api.transport.close()


def _param_type(value: object) -> Any:
    if isinstance(value, bool):
        return _P.BOOL
    if isinstance(value, int):
        return _P.INT64
    if isinstance(value, datetime):
        return _P.TIMESTAMP
    return _P.STRING
