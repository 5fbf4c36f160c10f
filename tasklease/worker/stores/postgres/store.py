"""Run records in PostgreSQL (Cloud SQL, AlloyDB, any server), in as few round trips as
the rules allow.

The rules stay those of :mod:`tasklease.worker.core.decisions`, applied here in Python; each
write is conditional on the row's ``version`` as read (a compare-and-set), so of two
concurrent changes one wins and the other reads again. Round trips (autocommit statements):

- a first claim: 1. One statement inserts the record the rules give for an absent run
  (``INSERT ... ON CONFLICT DO NOTHING``) and, when the run exists, returns its row instead.
- a duplicate answered from the record (completed, failed, skipped, in progress, another
  caller's): 1, that same statement.
- taking a run over (its lease expired, or released): 2, the statement and an ``UPDATE``
  conditional on the version it returned.
- renew and finish (complete, fail, release, skip) by the process that claimed: 1, an
  ``UPDATE`` conditional on the version of this attempt's own last write, which the store
  remembers. Otherwise (another process, a version that moved): 2, a read and the update.
- operator actions and locks: a read (a lock's change may read its holder's run too) and a
  conditional write.

Group commit (:mod:`~tasklease.worker.stores.postgres.group_commit`, ``group_commit=off``
to turn it off): the claim statements and the finishes above that the threads of one process
send at the same time go in one pipelined transaction, one round trip and one commit for all
of them; a statement sent alone is sent as it would be without it.

With ``server_clock`` (the default) a store call given a clock (the worker's) uses the
database server's clock instead: the time of the statement that read the record decides a
claim, a takeover and every change read first; a write made without a read first (a first
claim, a finish) uses the server's time as this process last measured it (its local clock
plus the offset each statement reports, good to half a round trip). Instances' own clocks
then no longer decide a takeover. A fixed time (a ``datetime``) is used as given.

Every call is bounded: ``statement_timeout`` on the server, waiting for a pooled connection
by ``pool_timeout``, and a watchdog (:mod:`~tasklease.worker.stores.postgres.watchdog`)
that cuts a call the server does not answer at all (frozen, unreachable). Each raises
:class:`StoreUnavailable`. A claim whose write may have landed unseen is given back soon
(:class:`~tasklease.worker.stores.firestore.orphans.OrphanClaims`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg import Connection
from psycopg_pool import ConnectionPool, PoolTimeout

from tasklease.errors import StoreUnavailable
from tasklease.plumbing.per_process import PerProcess
from tasklease.plumbing.url_secrets import scrubbed
from tasklease.worker.core import decisions, locking
from tasklease.worker.core.queries import Position, RunFilter
from tasklease.worker.core.records import (
    Claim,
    ClaimRequest,
    LockGrant,
    LockRecord,
    LockRequest,
    RunRecord,
    RunStatus,
    Verdict,
)
from tasklease.worker.stores.base.locks import LockStore
from tasklease.worker.stores.base.queries import OperatorQueries
from tasklease.worker.stores.base.store import Change, LockChange, Moment, Update, resolve
from tasklease.worker.stores.base.tally import TALLY_KEPT
from tasklease.worker.stores.firestore.orphans import OrphanClaims, orphan_released
from tasklease.worker.stores.postgres import locks, tally
from tasklease.worker.stores.postgres import transactions as postgres_transactions
from tasklease.worker.stores.postgres.diagnosis import why_no_connection
from tasklease.worker.stores.postgres.group_commit import StatementBatcher, fetch
from tasklease.worker.stores.postgres.options import Options
from tasklease.worker.stores.postgres.schema import (
    RUN_COLUMNS,
    Statements,
    decode_run,
    encode_run,
    encode_run_changes,
    migrate,
    scan_runs,
)
from tasklease.worker.stores.postgres.watchdog import CallTimedOut, Watchdog, WatchedConnection

_T = TypeVar("_T")
_log = logging.getLogger("tasklease.store.postgres")

MAX_ROUNDS = locks.MAX_ROUNDS
MAX_REMEMBERED_WRITES = 10_000
_VERSION_AT = len(RUN_COLUMNS)  # A read row: the record's columns, its version, the time.


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Process:
    """What one process holds: its pool, its batches, its watchdog, and the versions of its
    own writes."""

    pool: ConnectionPool[WatchedConnection]
    claims: StatementBatcher  # Its threads' claims, committed together; and their finishes.
    finishes: StatementBatcher
    watchdog: Watchdog = field(default_factory=Watchdog)
    ready: bool = False  # The schema is migrated.
    writes: OrderedDict[tuple[str, str], tuple[int, RunRecord]] = field(default_factory=OrderedDict)


class PostgresStore(
    LockStore, OperatorQueries, tally.PostgresTally, postgres_transactions.PostgresTransactions
):
    """Run records and locks in a PostgreSQL schema (created and migrated on first use).

    ``conninfo`` is a libpq URL or key/value string (``host=/cloudsql/PROJECT:REGION:INSTANCE``
    for Cloud SQL's Unix socket). Use :meth:`from_url` for a ``TASKLEASE_STORE`` URL, whose
    query may carry the options below. Connections are pooled per process (they must not
    cross a fork), opened lazily: a worker starts while the database is down and answers 503.
    """

    def __init__(self, conninfo: str, options: Options | None = None) -> None:
        self.options = options or Options()
        self._conninfo = self.options.libpq(conninfo)
        self.statements = Statements(self.options.schema)
        self._process = PerProcess(self._start_process)
        self._offset = timedelta(0)  # The server's clock minus ours, as last measured.
        self._statement_time = threading.local()
        self._server_time: Callable[[], datetime] = self._read_server_time
        self._orphans = OrphanClaims(self._give_back_orphan)
        # The first purge comes one interval after the store starts, as every later one.
        self._next_purge = time.monotonic() + self.options.purge_interval.total_seconds()

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        """The store ``postgresql://...?schema=...&max_size=...`` describes."""
        conninfo, options = Options.from_url(url)
        return cls(conninfo, options)

    def __repr__(self) -> str:
        return f"PostgresStore({self.options.describe(self._conninfo)})"

    # --- Runs ---------------------------------------------------------------------

    def claim(self, request: ClaimRequest, now: Moment) -> Claim:
        # The retry of a delivery whose claim landed unseen: give that claim back first.
        self._orphans.release(request.run_id)
        now = self._clock(now)
        attempted: list[RunRecord] = []

        def work(connection: Connection[Any]) -> Claim:
            for _ in range(MAX_ROUNDS):
                fresh = decisions.claim(None, request, resolve(now))
                attempted.append(fresh.record)
                params = [*encode_run(fresh.record), request.run_id]
                row = self._timed(connection, self.statements.claim, params, request.run_id)
                if row is None:
                    continue  # A first claim raced ours and committed after our snapshot.
                inserted, row = row[0], row[1:]
                if inserted:
                    self.remember_write(fresh.record, row[_VERSION_AT])
                    return fresh
                record = decode_run(row)
                if decisions.holds(record, request.attempt_id):  # Ours, landed by a retry.
                    self.remember_write(record, row[_VERSION_AT])
                    return Claim(Verdict.CLAIMED, record)
                with self._at(row[-1]):
                    outcome = decisions.claim(record, request, resolve(now))
                if outcome.verdict is not Verdict.CLAIMED:
                    return outcome
                attempted.append(outcome.record)
                if self._update_run(connection, record, outcome.record, row[_VERSION_AT]):
                    return outcome
            raise StoreUnavailable(f"run {request.run_id}: too much contention to claim it")

        try:
            claim = self._call("claim a run", work)
        except StoreUnavailable:
            if attempted:  # Its write may have landed: give it back soon.
                self._orphans.note(attempted[-1])
            raise
        self._purge_now_and_then()
        return claim

    def _if_held(
        self,
        run_id: str,
        attempt_id: str,
        update: Update,
        now: Moment,
        finished: RunStatus | None,
    ) -> RunRecord | None:
        now = self._clock(now)
        remembered = self._process.get().writes.get((run_id, attempt_id))
        if remembered is not None:  # One round trip: conditional on our own last write.
            version, record = remembered
            written = update(record, resolve(now))
            grouped = finished is not None  # A renewal may wait on a transactional handler.
            if self._call(
                "change a run", lambda c: self._update_run(c, record, written, version, grouped)
            ):
                return written
        return super()._if_held(run_id, attempt_id, update, now, finished)

    def _read_modify_write(self, run_id: str, change: Change[_T]) -> _T:
        def work(connection: Connection[Any]) -> _T:
            for _ in range(MAX_ROUNDS):
                row = self._timed(connection, self.statements.read_run, (run_id,))
                assert row is not None  # One row, its record's columns NULL if absent.
                version = row[_VERSION_AT]
                current = None if version is None else decode_run(row)
                with self._at(row[-1]):
                    new_record, value = change(current)
                if new_record is None:
                    return value
                if version is None:
                    inserted = connection.execute(
                        self.statements.insert_run, encode_run(new_record)
                    ).fetchone()
                    if inserted is not None:
                        self.remember_write(new_record, inserted[0])
                        return value
                elif current is not None and self._update_run(
                    connection, current, new_record, version
                ):
                    return value
            raise StoreUnavailable(f"run {run_id}: too much contention to change it")

        return self._call("change a run", work)

    def _update_run(
        self,
        connection: Connection[Any],
        before: RunRecord,
        record: RunRecord,
        version: int,
        group: bool = False,
    ) -> bool:
        """Write ``record`` if its row is still at ``version`` and ``before``'s attempt,
        where it holds ``before`` (sending only the columns that differ), with other threads'
        writes if ``group``; remember the new version."""
        columns, values = encode_run_changes(before, record)
        params = [*values, record.run_id, version, before.attempt_id]
        statement = self.statements.update_columns(columns)
        batches = self._process.get().finishes if group else None
        row = fetch(batches, connection, record.run_id, statement, params)[0]
        if row is None:
            self.forget_write(record.run_id, record.attempt_id)
            return False
        self.remember_write(record, row[0])
        return True

    def get(self, run_id: str) -> RunRecord | None:
        row = self._call(
            "read a run", lambda c: c.execute(self.statements.select_run, (run_id,)).fetchone()
        )
        return decode_run(row) if row else None

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        where, params = (" WHERE status = %s", [status.value]) if status else ("", [])
        sql = f"{self.statements.list_runs}{where} ORDER BY claimed_at DESC, run_id DESC LIMIT %s"
        return self._rows("list runs", sql, [*params, limit])

    def _scan_runs(self, filters: RunFilter, after: Position | None, limit: int) -> list[RunRecord]:
        return self._rows("list runs", *scan_runs(self.statements.list_runs, filters, after, limit))

    def _find_by_identity(self, name: str, value: str) -> list[RunRecord]:
        if name not in ("task_name", "job_name"):  # The two indexed identity fields.
            raise ValueError(f"runs are not looked up by {name!r}")
        sql = f"{self.statements.list_runs} WHERE identity->>'{name}' = %s"
        return self._rows("look runs up", sql, [value])

    def purge_expired(self, now: datetime) -> int:
        batch = self.options.purge_batch

        def run(statement: str, params: tuple[Any, ...]) -> int:
            return self._call("purge", lambda c: c.execute(statement, params).rowcount)

        purged = sum(locks.purge_batches(run, self.statements.purge_runs, now, batch))
        purged += sum(locks.purge_batches(run, self.statements.purge_locks, now, batch))
        return purged + self.purge_delivery_counts(now - TALLY_KEPT)

    # --- Locks --------------------------------------------------------------------

    def _read_modify_write_lock(self, name: str, change: LockChange[_T]) -> _T:
        return self._call(
            "change a lock",
            lambda c: locks.change_lock(c, self.statements, name, change, self._at),
        )

    def get_lock(self, name: str) -> LockRecord | None:
        return self._call("read a lock", lambda c: locks.get(c, self.statements, name))

    def list_locks(self, limit: int = 100) -> list[LockRecord]:
        return self._call("list locks", lambda c: locks.listed(c, self.statements, limit))

    # The calls whose rules read ``now``: given a clock, they read the server's instead.

    def acquire_lock(self, request: LockRequest, now: Moment) -> LockGrant:
        return super().acquire_lock(request, self._clock(now))

    def renew_lock(
        self, name: str, attempt_id: str, lease: timedelta, now: Moment
    ) -> datetime | None:
        return super().renew_lock(name, attempt_id, lease, self._clock(now))

    def release_lock(self, name: str, attempt_id: str, now: Moment) -> bool:
        return super().release_lock(name, attempt_id, self._clock(now))

    def operator_release_lock(
        self, name: str, now: Moment, *, force: bool = False
    ) -> locking.OperatorLockRelease:
        return super().operator_release_lock(name, self._clock(now), force=force)

    def operator_release(
        self,
        run_id: str,
        now: Moment,
        *,
        force: bool = False,
        attempt_id: str | None = None,
        fencing_token: int | None = None,
    ) -> decisions.OperatorRelease:
        return super().operator_release(
            run_id,
            self._clock(now),
            force=force,
            attempt_id=attempt_id,
            fencing_token=fencing_token,
        )

    def close(self) -> None:
        self._orphans.close()
        process = self._process.made_here()
        if process is not None:
            process.pool.close()
        self._process.forget()

    # --- Time ---------------------------------------------------------------------

    def _clock(self, now: Moment) -> Moment:
        """The moment a call uses: the server's clock in place of a given clock."""
        return self._server_time if self.options.server_clock and callable(now) else now

    def _read_server_time(self) -> datetime:
        """The time of the statement that read the record being changed, else the server's
        time as last measured."""
        at: datetime | None = getattr(self._statement_time, "value", None)
        return at if at is not None else _utc_now() + self._offset

    @contextmanager
    def _at(self, server_time: datetime) -> Iterator[None]:
        self._statement_time.value = server_time.astimezone(UTC)
        try:
            yield
        finally:
            self._statement_time.value = None

    def _timed(
        self, connection: Connection[Any], statement: str, params: Any, run: str = ""
    ) -> Any:
        """Run a statement that returns the server's time last; measure the clock offset.
        On a ``run``, it may go with other threads' statements (group commit)."""
        group = self._process.get().claims if run else None
        row, sent, received = fetch(group, connection, run, statement, params)
        if row is not None:
            self._offset = row[-1] - (sent + (received - sent) / 2)
        return row

    # --- Connections ----------------------------------------------------------------

    def _call(self, action: str, work: Callable[[Connection[Any]], _T]) -> _T:
        """``work`` on a pooled connection, bounded; every failure is StoreUnavailable. A
        connection found dead (the server restarted since) is replaced once, and the pool's
        idle connections are checked then. A retried ``work`` may find its own write landed:
        every caller recognises it by the attempt id or the rules."""
        timeout = self.options.call_timeout
        for attempt in range(2):
            process = self.ready_process()
            used: Connection[Any] | None = None
            try:
                with (
                    process.pool.connection(timeout=self.options.pool_timeout) as used,
                    process.watchdog.bounded(used, timeout),
                ):
                    return work(used)
            except CallTimedOut as exc:
                raise self.unavailable_error(
                    action, f"the server did not answer within {timeout:g}s"
                ) from exc
            except PoolTimeout as exc:
                raise self.no_connection_error(action, exc) from exc
            except psycopg.OperationalError as exc:
                if attempt == 0 and used is not None and used.broken:
                    # The server restarted since: the pool's idle connections are dead too.
                    with contextlib.suppress(psycopg.Error, PoolTimeout):
                        process.pool.check()
                    continue
                raise self.unavailable_error(action, str(exc)) from exc
            except psycopg.Error as exc:
                raise self.unavailable_error(action, str(exc)) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def no_connection_error(self, action: str, waited: PoolTimeout) -> StoreUnavailable:
        why = why_no_connection(self._conninfo, waited, self.options.call_timeout)
        return self.unavailable_error(action, why)

    def unavailable_error(self, action: str, why: str) -> StoreUnavailable:
        why = scrubbed(why, self._conninfo)  # A driver's message may quote the connection.
        return StoreUnavailable(
            f"Postgres store ({self.options.schema}): could not {action}: {why}"
        )

    def ready_process(self) -> _Process:
        process = self._process.get()
        if not process.ready:
            try:
                with (
                    process.pool.connection(timeout=self.options.pool_timeout) as connection,
                    process.watchdog.bounded(connection, self.options.call_timeout),
                ):
                    migrate(connection, self.options.schema)
            except PoolTimeout as exc:
                raise self.no_connection_error("create its tables", exc) from exc
            except (psycopg.Error, CallTimedOut) as exc:
                raise self.unavailable_error("create its tables", str(exc)) from exc
            process.ready = True
        return process

    def _start_process(self) -> _Process:
        self._orphans.forget_all()  # A forked child: the parent process still owns them.
        pool: ConnectionPool[WatchedConnection] = ConnectionPool(
            self._conninfo,
            connection_class=WatchedConnection,
            min_size=self.options.min_size,
            max_size=self.options.max_size,
            open=False,
            timeout=self.options.pool_timeout,
            kwargs={"autocommit": True},
            configure=self._configure,
            name=f"tasklease-{self.options.schema}",
        )
        pool.open(wait=False)
        on = self.options.group_commit
        return _Process(pool, StatementBatcher(on), StatementBatcher(on))

    def _configure(self, connection: Connection[Any]) -> None:
        """A new connection: measure the server's clock against ours."""
        self._timed(connection, self.statements.now, ())

    def remember_write(self, record: RunRecord, version: int) -> None:
        writes = self._process.get().writes
        key = (record.run_id, record.attempt_id)
        if record.status is not RunStatus.IN_PROGRESS:
            writes.pop(key, None)  # Finished: nothing more to condition on.
            return
        writes[key] = (version, record)
        writes.move_to_end(key)
        while len(writes) > MAX_REMEMBERED_WRITES:
            writes.popitem(last=False)

    def forget_write(self, run_id: str, attempt_id: str) -> None:
        self._process.get().writes.pop((run_id, attempt_id), None)

    def _rows(self, action: str, sql: str, params: list[Any]) -> list[RunRecord]:
        rows = self._call(action, lambda c: c.execute(sql, params).fetchall())
        return [decode_run(row) for row in rows]

    def _give_back_orphan(
        self, run_id: str, attempt_id: str, claimed_at: datetime
    ) -> RunRecord | None:
        return self._if_held(run_id, attempt_id, orphan_released, claimed_at, RunStatus.RELEASED)

    def _purge_now_and_then(self) -> None:
        """Every ``purge_interval``, purge in the background: a claim never waits for it."""
        if time.monotonic() < self._next_purge:
            return
        self._next_purge = time.monotonic() + self.options.purge_interval.total_seconds()
        threading.Thread(target=self._purge, name="tasklease-postgres-purge", daemon=True).start()

    def _purge(self) -> None:
        try:
            purged = self.purge_expired(self._read_server_time())
        except StoreUnavailable:
            _log.warning("purging expired runs failed; will try again", exc_info=True)
            return
        if purged:
            _log.info("purged %d expired runs and locks from %r", purged, self)
