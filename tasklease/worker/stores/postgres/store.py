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
- a child's finish (``fan_out(..., then=...)``): the same, its run row's write, its entry
  and its join's count in one statement (:mod:`.fan_ins`): 1 by the process that claimed,
  else 2.
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
(:class:`~tasklease.worker.stores.base.orphans.OrphanClaims`).

The claim and the holder's writes are the shared conditional-write algorithm
(:mod:`~tasklease.worker.stores.base.conditional_claims`) over the rows' primitives
(:mod:`.rows`), run on one connection per call; connections, transactions and the tally are
collaborators the store holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from psycopg import Connection

from tasklease.errors import StoreUnavailable
from tasklease.joins import Member
from tasklease.worker.core import decisions, locking
from tasklease.worker.core import fan_in as rules
from tasklease.worker.core.fan_in import ChildEntry, FanInRecord, Progress
from tasklease.worker.core.queries import Position, RunFilter
from tasklease.worker.core.records import (
    Claim,
    ClaimRequest,
    LockGrant,
    LockRecord,
    LockRequest,
    RunRecord,
    RunStatus,
)
from tasklease.worker.stores.base.conditional_claims import (
    MAX_REMEMBERED_WRITES,
    ConditionalClaims,
    ConditionalWrites,
)
from tasklease.worker.stores.base.fan_ins import DEFAULT_KEEP, FanInStore
from tasklease.worker.stores.base.locks import LockStore
from tasklease.worker.stores.base.queries import OperatorQueries
from tasklease.worker.stores.base.store import Change, LockChange, Moment, Update, resolve
from tasklease.worker.stores.base.tally import TALLY_KEPT, DeliveryTally, MinuteCounts, TallyKey
from tasklease.worker.stores.base.transactional import (
    StepWork,
    TransactionalStore,
    TransactionOutcome,
    Work,
)
from tasklease.worker.stores.postgres import locks
from tasklease.worker.stores.postgres.connections import PostgresConnections
from tasklease.worker.stores.postgres.fan_ins import PostgresFanIns
from tasklease.worker.stores.postgres.group_commit import fetch
from tasklease.worker.stores.postgres.options import Options
from tasklease.worker.stores.postgres.rows import PostgresRows
from tasklease.worker.stores.postgres.schema import Statements, decode_run, scan_runs
from tasklease.worker.stores.postgres.tally import PostgresTally
from tasklease.worker.stores.postgres.transactions import PostgresTransactions

__all__ = ["MAX_REMEMBERED_WRITES", "MAX_ROUNDS", "PostgresStore"]

_T = TypeVar("_T")
_log = logging.getLogger("tasklease.store.postgres")

MAX_ROUNDS = locks.MAX_ROUNDS


def _utc_now() -> datetime:
    return datetime.now(UTC)


class PostgresStore(LockStore, FanInStore, OperatorQueries, DeliveryTally, TransactionalStore):
    """Run records, locks and joins in a PostgreSQL schema (created and migrated on first
    use).

    ``conninfo`` is a libpq URL or key/value string (``host=/cloudsql/PROJECT:REGION:INSTANCE``
    for Cloud SQL's Unix socket). Use :meth:`from_url` for a ``TASKLEASE_STORE`` URL, whose
    query may carry the options below. Connections are pooled per process (they must not
    cross a fork), opened lazily: a worker starts while the database is down and answers 503.
    """

    def __init__(self, conninfo: str, options: Options | None = None) -> None:
        self.options = options or Options()
        self._conninfo = self.options.libpq(conninfo)
        self.statements = Statements(self.options.schema)
        self._offset = timedelta(0)  # The server's clock minus ours, as last measured.
        self._statement_time = threading.local()
        self._server_time: Callable[[], datetime] = self._read_server_time
        # The claim and the holder's writes by compare-and-set, in one connection's call
        # each: a failure anywhere in it may follow a write that landed.
        self.claims = ConditionalClaims(
            self._on_rows,
            name=f"Postgres store ({self.options.schema})",
            max_rounds=MAX_ROUNDS,
            any_failure_may_have_landed=True,
        )
        self.connections = PostgresConnections(
            self._conninfo,
            self.options,
            configure=self._configure,
            # A forked child: the parent process still owns what it remembered.
            on_new_process=self.claims.forget_all,
        )
        self.transactions = PostgresTransactions(
            self.connections, self.statements, self.claims.writes, self.get
        )
        self.tally = PostgresTally(self.connections.call, self.options.schema)
        self.fan_ins = PostgresFanIns(self.connections.call, self.statements)
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
        claim = self.claims.claim(request, self._clock(now))
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
        return self.claims.if_held(run_id, attempt_id, update, self._clock(now), finished)

    def _read_modify_write(self, run_id: str, change: Change[_T]) -> _T:
        def work(connection: Connection[Any]) -> _T:
            rows = self._rows(connection)
            for _ in range(MAX_ROUNDS):
                found, read_at = rows.read(run_id)
                with self._at(read_at):
                    new_record, value = change(None if found is None else found.record)
                if new_record is None:
                    return value
                version = (
                    rows.insert(new_record)
                    if found is None
                    else rows.write_if_version(found, new_record)
                )
                if version is not None:
                    self.claims.writes.remember(new_record, version)
                    return value
                if found is not None:
                    self.claims.writes.forget(new_record.run_id, new_record.attempt_id)
            raise StoreUnavailable(f"run {run_id}: too much contention to change it")

        return self._call("change a run", work)

    def _on_rows(self, action: str, body: Callable[[ConditionalWrites[int]], _T]) -> _T:
        return self._call(action, lambda connection: body(self._rows(connection)))

    def _rows(self, connection: Connection[Any]) -> PostgresRows:
        finishes = self.connections.process().finishes
        return PostgresRows(
            connection, self.statements, timed=self._timed, at=self._at, finishes=finishes
        )

    def get(self, run_id: str) -> RunRecord | None:
        row = self._call(
            "read a run", lambda c: c.execute(self.statements.select_run, (run_id,)).fetchone()
        )
        return decode_run(row) if row else None

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        where, params = (" WHERE status = %s", [status.value]) if status else ("", [])
        sql = f"{self.statements.list_runs}{where} ORDER BY claimed_at DESC, run_id DESC LIMIT %s"
        return self._records("list runs", sql, [*params, limit])

    def _scan_runs(self, filters: RunFilter, after: Position | None, limit: int) -> list[RunRecord]:
        return self._records(
            "list runs", *scan_runs(self.statements.list_runs, filters, after, limit)
        )

    def _find_by_identity(self, name: str, value: str) -> list[RunRecord]:
        if name not in ("task_name", "job_name"):  # The two indexed identity fields.
            raise ValueError(f"runs are not looked up by {name!r}")
        sql = f"{self.statements.list_runs} WHERE identity->>'{name}' = %s"
        return self._records("look runs up", sql, [value])

    def purge_expired(self, now: datetime) -> int:
        batch = self.options.purge_batch

        def run(statement: str, params: tuple[Any, ...]) -> int:
            return self._call("purge", lambda c: c.execute(statement, params).rowcount)

        purged = sum(locks.purge_batches(run, self.statements.purge_runs, now, batch))
        purged += sum(locks.purge_batches(run, self.statements.purge_locks, now, batch))
        purged += self.fan_ins.purge(now, batch)  # Joins, with their entries.
        return purged + self.purge_delivery_counts(now - TALLY_KEPT)

    # --- Joins --------------------------------------------------------------------

    def _read_modify_write_member(
        self, run_id: str, member: Member, change: Change[_T], now: Moment, keep_for: timedelta
    ) -> tuple[_T, Progress]:
        """Read the run, then its change and the child's count in one statement,
        conditional on the version read (read again if it moved)."""
        now = self._clock(now)

        def work(connection: Connection[Any]) -> tuple[_T, Progress]:
            rows = self._rows(connection)
            for _ in range(MAX_ROUNDS):
                found, read_at = rows.read(run_id)
                stored = None if found is None else found.record
                with self._at(read_at):
                    new_record, value = change(stored)
                    at = resolve(now)
                entry = rules.entry_of(new_record or stored, member)
                write = self.fan_ins.statements.run_write(found, new_record)
                if write is None or (new_record is None and entry is None):
                    return value, self.fan_ins.progress(connection, member.join_id)
                counted = self.fan_ins.count(
                    connection, run_id, write, member=member, entry=entry, at=at, keep_for=keep_for
                )
                if counted is not None:
                    if new_record is not None:
                        self.claims.writes.remember(new_record, counted[0])
                    return value, counted[1]
                if new_record is not None:
                    self.claims.writes.forget(new_record.run_id, new_record.attempt_id)
            raise StoreUnavailable(f"run {run_id}: too much contention to count it")

        return self._call("count a fan-in child", work)

    def _finish_member(
        self,
        member: Member,
        *,
        run_id: str,
        attempt_id: str,
        update: Update,
        now: Moment,
        status: RunStatus,
        keep_for: timedelta | None,
    ) -> Progress | None:
        """A child's finish, as any finish here: one statement, sent with other threads'
        finishes, conditional on the version of this attempt's last write when this process
        remembers it (the attempt then holds the claim as that write left it); otherwise,
        or if the row moved on, read first (:meth:`_read_modify_write_member`)."""
        now = self._clock(now)
        held = self.claims.writes.recall(run_id, attempt_id)
        if held is not None:
            at = resolve(now)
            written = decisions.kept(update(held.record, at), at, keep_for)
            write = self.fan_ins.statements.run_write(held, written)
            assert write is not None  # A write over a row read.
            entry = rules.entry_of(written, member)
            batches = self.connections.process().finishes
            counted = self._call(
                "finish a run",
                lambda c: self.fan_ins.count(
                    c,
                    run_id,
                    write,
                    member=member,
                    entry=entry,
                    at=at,
                    keep_for=keep_for or DEFAULT_KEEP,
                    batches=batches,
                ),
            )
            if counted is not None:
                self.claims.writes.remember(written, counted[0])  # Finished: forgotten.
                return counted[1]
            self.claims.writes.forget(run_id, attempt_id)
        return super()._finish_member(
            member,
            run_id=run_id,
            attempt_id=attempt_id,
            update=update,
            now=now,
            status=status,
            keep_for=keep_for,
        )

    def get_fan_in(self, join_id: str) -> FanInRecord | None:
        return self.fan_ins.get(join_id)

    def fan_in_entries(
        self, join_id: str, after: str | None = None, limit: int = rules.MAX_INLINE_RESULTS
    ) -> list[ChildEntry]:
        return self.fan_ins.entries(join_id, after, limit)

    def fan_ins_of(self, parent_run_id: str, limit: int = 100) -> list[FanInRecord]:
        return self.fan_ins.of_parent(parent_run_id, limit)

    def mark_then_enqueued(self, join_id: str, now: datetime) -> None:
        self.fan_ins.mark_then_enqueued(join_id, now)

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
        self.claims.close()
        self.connections.close()

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
        group = self.connections.process().claims if run else None
        row, sent, received = fetch(group, connection, run, statement, params)
        if row is not None:
            self._offset = row[-1] - (sent + (received - sent) / 2)
        return row

    # --- Connections ----------------------------------------------------------------

    def _call(self, action: str, work: Callable[[Connection[Any]], _T]) -> _T:
        return self.connections.call(action, work)

    def _configure(self, connection: Connection[Any]) -> None:
        """A new connection: measure the server's clock against ours."""
        self._timed(connection, self.statements.now, ())

    def _records(self, action: str, sql: str, params: list[Any]) -> list[RunRecord]:
        rows = self._call(action, lambda c: c.execute(sql, params).fetchall())
        return [decode_run(row) for row in rows]

    # --- Capabilities held as collaborators -----------------------------------------

    def complete_in_transaction(
        self,
        run_id: str,
        attempt_id: str,
        work: Work,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> TransactionOutcome:
        """``ctx.transaction`` is a pooled psycopg ``Connection`` inside a transaction, in
        pipeline mode (see :mod:`.transactions`)."""
        return self.transactions.complete(run_id, attempt_id, work, now=now, keep_for=keep_for)

    def record_step_in_transaction(
        self, run_id: str, attempt_id: str, step_work: StepWork, now: Moment
    ) -> TransactionOutcome:
        """The step's function gets the connection a transactional handler would."""
        return self.transactions.record_step(run_id, attempt_id, step_work)

    def write_delivery_counts(self, instance: str, counts: MinuteCounts) -> None:
        self.tally.write(instance, counts)

    def delivery_counts(self, since: datetime) -> dict[datetime, Counter[TallyKey]]:
        return self.tally.read(since)

    def purge_delivery_counts(self, before: datetime) -> int:
        return self.tally.purge(before)

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
