"""The Postgres store's joins: the ``fan_ins`` and ``fan_in_entries`` tables (schema
version 4, :mod:`.schema`).

A join is one row (its counts), and each counted child one entry row keyed by the join and
the child's key, so a child can never count twice. A child's finish is one statement
(:meth:`FanInStatements.counting`), so one transaction and one round trip: the run row's
write conditional on its version (a child final as stored, which a recount or a duplicate
counts: its row locked as read, ``FOR SHARE``), then the entry's ``INSERT ... ON CONFLICT DO
NOTHING`` from the row written, then, only for an entry inserted, the join's upsert that
counts it.
The rules are those of :func:`~tasklease.worker.stores.base.fan_ins.count_member_in`,
written as SQL: the entry is :func:`~tasklease.worker.core.fan_in.entry_of` the record,
the row inserted for a new join is :func:`~tasklease.worker.core.fan_in.opened` with the
entry :func:`~tasklease.worker.core.fan_in.counted`, and counting it in a join that exists
adds that row's counts and keeps the later expiry, as ``counted`` does.

One statement rather than a read of the join, a check of the entry and two writes: a
count locks its join's row until the commit, and in one statement the commit follows at
once, so the children of one join finishing together each hold it for one statement, not
for several round trips.

Progress: a child whose entry is inserted reads the join as its own upsert left it (the
latest row, under its lock), so the child that counts last is told the join closed. A child
found counted already (a duplicate, a retry) reads the join as of its statement's start,
which may miss a count committed meanwhile; it closed nothing, and the child that did is
told so itself.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, LiteralString

from psycopg import Connection, sql

from tasklease.joins import Member
from tasklease.worker.core import fan_in as rules
from tasklease.worker.core.fan_in import ChildEntry, FanInRecord, Progress
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.stores.base.conditional_claims import Versioned
from tasklease.worker.stores.postgres.group_commit import StatementBatcher, fetch
from tasklease.worker.stores.postgres.locks import purge_batches
from tasklease.worker.stores.postgres.rows import conditional_write
from tasklease.worker.stores.postgres.schema import Statements, encode_run
from tasklease.worker.stores.postgres.tally import Call

__all__ = ["FanInStatements", "PostgresFanIns", "RunWrite"]

RunWrite = tuple[str, list[Any]]
"""A statement on a run's row that returns its ``version`` (no row: the row moved on), and
its parameters."""

# After ``WITH run AS (<a RunWrite>)``. The entry is inserted from the run's row (none: the
# write did not land, nothing is counted) when the record is final (the last parameter of
# the entry's); the join is counted from the entry inserted (none: counted before). Each
# value is cast: a parameter in a SELECT list takes no type from the column it fills.
_COUNTING: LiteralString = (
    ", entry AS (INSERT INTO {s}.fan_in_entries "
    "(join_id, child_key, run_id, status, finished_at, result, error) "
    "SELECT %s::text, %s::text, %s::text, %s::text, %s::timestamptz, %s::text, %s::text "
    "FROM run WHERE %s::boolean "
    "ON CONFLICT (join_id, child_key) DO NOTHING RETURNING join_id), "
    "counted AS (INSERT INTO {s}.fan_ins AS j (join_id, parent_run_id, then_handler, expected, "
    "completed, failed, created_at, expire_at) SELECT %s::text, %s::text, %s::text, "
    "%s::integer, %s::integer, %s::integer, %s::timestamptz, %s::timestamptz FROM entry "
    "ON CONFLICT (join_id) DO UPDATE SET completed = j.completed + EXCLUDED.completed, "
    "failed = j.failed + EXCLUDED.failed, expire_at = GREATEST(j.expire_at, EXCLUDED.expire_at) "
    "RETURNING completed + failed >= expected AS closed, then_enqueued_at IS NOT NULL AS noted), "
    "joined AS (SELECT closed, noted FROM counted UNION ALL "
    "SELECT completed + failed >= expected, then_enqueued_at IS NOT NULL FROM {s}.fan_ins "
    "WHERE join_id = %s AND NOT EXISTS (SELECT FROM counted)) "
    "SELECT (SELECT version FROM run), joined.closed, joined.noted "
    "FROM (VALUES (1)) AS one LEFT JOIN joined ON true"
)


class FanInStatements:
    """The statements on the joins of ``statements``' schema, composed once."""

    def __init__(self, statements: Statements) -> None:
        s = sql.Identifier(statements.schema)

        def text(template: LiteralString) -> str:
            # Composed from constant identifiers only; every value stays a parameter.
            return sql.SQL(template).format(s=s).as_string(None)

        self.runs = statements
        self._counting = text(_COUNTING)
        self._counting_after: dict[str, str] = {}
        # A final record counted as stored: its row kept as read until the commit (a change
        # committed since the statement began leaves no row: read it again).
        self.lock_run = text(
            "SELECT version FROM {s}.runs "
            "WHERE run_id = %s AND version = %s AND attempt_id = %s FOR SHARE"
        )
        self.progress = text(
            "SELECT completed + failed >= expected, then_enqueued_at IS NOT NULL "
            "FROM {s}.fan_ins WHERE join_id = %s"
        )
        joins = (
            "SELECT join_id, parent_run_id, then_handler, expected, completed, failed, "
            "created_at, expire_at, then_enqueued_at FROM {s}.fan_ins"
        )
        self.get = text(joins + " WHERE join_id = %s")
        self.entries = text(
            "SELECT join_id, child_key, run_id, status, finished_at, result, error "
            "FROM {s}.fan_in_entries "
            "WHERE join_id = %s AND child_key > %s ORDER BY child_key LIMIT %s"
        )
        self.of_parent = text(
            joins + " WHERE parent_run_id = %s ORDER BY created_at DESC, join_id DESC LIMIT %s"
        )
        self.mark_then_enqueued = text(
            "UPDATE {s}.fan_ins SET then_enqueued_at = %s "
            "WHERE join_id = %s AND then_enqueued_at IS NULL"
        )
        # A batch of expired joins and their entries, in one statement; how many joins.
        self.purge = text(
            "WITH gone AS (DELETE FROM {s}.fan_ins WHERE expire_at <= %s AND join_id IN "
            "(SELECT join_id FROM {s}.fan_ins WHERE expire_at <= %s ORDER BY expire_at LIMIT %s) "
            "RETURNING join_id), "
            "entries AS (DELETE FROM {s}.fan_in_entries WHERE join_id IN "
            "(SELECT join_id FROM gone)) "
            "SELECT count(*) FROM gone"
        )

    def counting(self, run_statement: str) -> str:
        """``run_statement`` (a :data:`RunWrite`'s) with the child's count after it."""
        statement = self._counting_after.get(run_statement)
        if statement is None:
            statement = f"WITH run AS ({run_statement}){self._counting}"
            self._counting_after[run_statement] = statement
        return statement

    def run_write(self, found: Versioned[int] | None, record: RunRecord | None) -> RunWrite | None:
        """The write of ``record`` over ``found`` (the row as read: None, absent), or with
        no record, ``found`` locked as read; None when neither."""
        if record is not None and found is not None:
            return conditional_write(self.runs, found, record)
        if record is not None:
            return self.runs.insert_run, encode_run(record)
        if found is not None:
            return self.lock_run, [found.record.run_id, found.version, found.record.attempt_id]
        return None


class PostgresFanIns:
    """The joins of the Postgres store: the child's count (on the connection of the store
    call that writes its run) and the reads and notes of :class:`~tasklease.worker.stores.
    base.fan_ins.FanInStore`, each through the store's bounded ``call``."""

    def __init__(self, call: Call, statements: Statements) -> None:
        self._call = call
        self.statements = FanInStatements(statements)

    def count(
        self,
        connection: Connection[Any],
        run_id: str,
        write: RunWrite,
        *,
        member: Member,
        entry: ChildEntry | None,
        at: datetime,
        keep_for: timedelta,
        batches: StatementBatcher | None = None,
    ) -> tuple[int, Progress] | None:
        """``write`` on ``run_id``'s row and, when the record is final (``entry``), ``member``
        counted, in one statement (with other threads' finishes through ``batches``): the
        row's version and the join's progress; None if the write found the row moved on
        (nothing written, nothing counted)."""
        statement, params = write
        fresh = _first_count(member, entry, at, keep_for)
        row = fetch(
            batches,
            connection,
            run_id,
            self.statements.counting(statement),
            [*params, *_entry_params(entry), *fresh, member.join_id],
            order=(member.join_id, run_id),  # A batch takes its joins' rows in one order.
        )[0]
        if row is None or row[0] is None:
            return None
        version, closed, noted = row
        return int(version), Progress(member.join_id, bool(closed), bool(noted))

    def progress(self, connection: Connection[Any], join_id: str) -> Progress:
        """The join's progress as stored (not closed, nothing noted, when it has no row)."""
        row = connection.execute(self.statements.progress, (join_id,)).fetchone()
        return Progress(join_id, bool(row and row[0]), bool(row and row[1]))

    def get(self, join_id: str) -> FanInRecord | None:
        statement = self.statements.get
        row = self._call("read a fan-in", lambda c: c.execute(statement, (join_id,)).fetchone())
        return None if row is None else _join(row)

    def entries(self, join_id: str, after: str | None, limit: int) -> list[ChildEntry]:
        statement, params = self.statements.entries, (join_id, after or "", limit)
        rows = self._call(
            "read a fan-in's entries", lambda c: c.execute(statement, params).fetchall()
        )
        return [_entry(row) for row in rows]

    def of_parent(self, parent_run_id: str, limit: int) -> list[FanInRecord]:
        statement, params = self.statements.of_parent, (parent_run_id, limit)
        rows = self._call("list a run's fan-ins", lambda c: c.execute(statement, params).fetchall())
        return [_join(row) for row in rows]

    def mark_then_enqueued(self, join_id: str, now: datetime) -> None:
        statement, params = self.statements.mark_then_enqueued, (now, join_id)
        self._call("note a fan-in's then task", lambda c: c.execute(statement, params))

    def purge(self, now: datetime, batch: int) -> int:
        """Delete the joins expired at ``now`` with their entries, ``batch`` joins a
        statement (:func:`.locks.purge_batches`); return how many joins."""

        def run(statement: str, params: tuple[Any, ...]) -> int:
            def purge(connection: Connection[Any]) -> int:
                row = connection.execute(statement, params).fetchone()
                return 0 if row is None else int(row[0])

            return self._call("purge fan-ins", purge)

        return sum(purge_batches(run, self.statements.purge, now, batch))


def _first_count(
    member: Member, entry: ChildEntry | None, at: datetime, keep_for: timedelta
) -> list[Any]:
    """The join's row as the entry's count creates it (its counts what the entry adds to a
    join that exists); no entry, no count (the values go unused)."""
    join = rules.opened(member, at, keep_for)
    if entry is not None:
        join = rules.counted(join, entry, at, keep_for)
    return [
        join.join_id,
        join.parent_run_id,
        join.then,
        join.expected,
        join.completed,
        join.failed,
        join.created_at,
        join.expire_at,
    ]


def _entry_params(entry: ChildEntry | None) -> list[Any]:
    """The entry's columns, and whether there is one to insert."""
    if entry is None:
        return [None] * 7 + [False]
    return [
        entry.join_id,
        entry.key,
        entry.run_id,
        entry.status.value,
        entry.finished_at,
        entry.result_json,
        entry.error,
        True,
    ]


def _join(row: tuple[Any, ...]) -> FanInRecord:
    join_id, parent, then, expected, completed, failed, created, expire, enqueued = row
    return FanInRecord(
        join_id,
        parent,
        then,
        int(expected),
        _utc(created),
        _utc(expire),
        completed=int(completed),
        failed=int(failed),
        then_enqueued_at=None if enqueued is None else _utc(enqueued),
    )


def _entry(row: tuple[Any, ...]) -> ChildEntry:
    join_id, key, run_id, status, finished, result, error = row
    return ChildEntry(join_id, key, run_id, RunStatus(status), _utc(finished), result, error)


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)
