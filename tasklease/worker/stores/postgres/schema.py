"""The Postgres store's tables, their migrations, its row codec and its SQL statements.

The tables live in one Postgres schema (``tasklease`` unless the URL names another):
``runs``, ``locks``, ``delivery_tally``, ``fan_ins`` and ``fan_in_entries`` (:mod:`.fan_ins`),
and ``schema_version``. The store creates and migrates them on first use,
under an advisory lock so that the processes of a deploy opening together migrate once.

Rows are encoded from the record dataclasses' own fields by :mod:`.codec` (a column per
field, the same name), so a field added to :class:`RunRecord` needs a column here, not a
second mapping.
Every row has a ``version`` that each write increments: the compare-and-set the store's
changes are conditional on.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, LiteralString

from psycopg import Connection, sql
from psycopg.types.json import Jsonb

from tasklease.errors import StoreUnavailable
from tasklease.worker.core import locking
from tasklease.worker.core.queries import Position, RunFilter
from tasklease.worker.core.records import LockRecord, RunRecord
from tasklease.worker.stores.base.codec import Conversion, RecordCodec
from tasklease.worker.stores.postgres import tally

SCHEMA_VERSION = 5  # 2: runs.steps_json, runs.continuation_json (durable steps); 3: the tally;
# 4: the joins of fan-ins; 5: runs.waits_json, runs.cancelled_by, runs.cancelled_at.
DEFAULT_SCHEMA = "tasklease"

# Each entry migrates from the version before it; entry n creates version n + 1.
_MIGRATIONS: list[list[LiteralString]] = [
    [
        """CREATE TABLE IF NOT EXISTS {s}.runs (
            run_id text PRIMARY KEY,
            kind text NOT NULL,
            handler text NOT NULL,
            status text NOT NULL,
            attempt_id text NOT NULL,
            fencing_token bigint NOT NULL,
            attempts integer NOT NULL,
            lease_expires timestamptz NOT NULL,
            expire_at timestamptz NOT NULL,
            claimed_at timestamptz NOT NULL,
            identity jsonb NOT NULL,
            finished_at timestamptz,
            result_json text,
            error text,
            payload text,
            caller text,
            replay_of text,
            replayed_as text,
            version bigint NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS runs_by_expiry ON {s}.runs (expire_at)",
        "CREATE INDEX IF NOT EXISTS runs_by_claim ON {s}.runs (claimed_at DESC, run_id DESC)",
        """CREATE INDEX IF NOT EXISTS runs_by_status
            ON {s}.runs (status, claimed_at DESC, run_id DESC)""",
        "CREATE INDEX IF NOT EXISTS runs_by_handler ON {s}.runs (handler, claimed_at DESC)",
        # Partial: a run has a task name or a job name, never both.
        """CREATE INDEX IF NOT EXISTS runs_by_task ON {s}.runs ((identity->>'task_name'))
            WHERE identity->>'task_name' IS NOT NULL""",
        """CREATE INDEX IF NOT EXISTS runs_by_job ON {s}.runs ((identity->>'job_name'))
            WHERE identity->>'job_name' IS NOT NULL""",
        """CREATE TABLE IF NOT EXISTS {s}.locks (
            name text PRIMARY KEY,
            holder_run_id text NOT NULL,
            holder_attempt_id text NOT NULL,
            fencing_token bigint NOT NULL,
            started_at timestamptz NOT NULL,
            lease_expires timestamptz NOT NULL,
            safety_expires timestamptz NOT NULL,
            next_start_at timestamptz NOT NULL,
            released_at timestamptz,
            lapses_at timestamptz NOT NULL,
            version bigint NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS locks_by_lapse ON {s}.locks (lapses_at)",
        "CREATE INDEX IF NOT EXISTS locks_by_start ON {s}.locks (started_at DESC, name DESC)",
    ],
    [
        "ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS steps_json text",
        "ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS continuation_json text",
    ],
    [tally.TABLE, tally.INDEX],
    [
        """CREATE TABLE IF NOT EXISTS {s}.fan_ins (
            join_id text PRIMARY KEY,
            parent_run_id text NOT NULL,
            then_handler text NOT NULL,
            expected integer NOT NULL,
            completed integer NOT NULL,
            failed integer NOT NULL,
            created_at timestamptz NOT NULL,
            expire_at timestamptz NOT NULL,
            then_enqueued_at timestamptz
        )""",
        """CREATE INDEX IF NOT EXISTS fan_ins_by_parent
            ON {s}.fan_ins (parent_run_id, created_at DESC, join_id DESC)""",
        "CREATE INDEX IF NOT EXISTS fan_ins_by_expiry ON {s}.fan_ins (expire_at)",
        # Keys in byte order (the "C" collation), as the other stores page them, whatever
        # the database's own collation.
        """CREATE TABLE IF NOT EXISTS {s}.fan_in_entries (
            join_id text NOT NULL,
            child_key text COLLATE "C" NOT NULL,
            run_id text NOT NULL,
            status text NOT NULL,
            finished_at timestamptz NOT NULL,
            result text,
            error text,
            PRIMARY KEY (join_id, child_key)
        )""",
    ],
    [
        "ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS waits_json text",
        "ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS cancelled_by text",
        "ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS cancelled_at timestamptz",
    ],
]


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


_TIME = Conversion(decode=_utc)
_RUNS = RecordCodec(RunRecord, time=_TIME, mapping=Conversion(encode=Jsonb))
_LOCKS = RecordCodec(LockRecord, time=_TIME)
RUN_COLUMNS = _RUNS.names
LOCK_COLUMNS = _LOCKS.names


def migrate(connection: Connection[Any], schema: str) -> None:
    """Create or migrate ``schema``'s tables to :data:`SCHEMA_VERSION` (idempotent)."""
    s = sql.Identifier(schema)
    with connection.transaction():
        # Serialises the processes opening one schema together (CREATE ... IF NOT EXISTS is
        # not safe against a concurrent CREATE of the same name).
        connection.execute(
            "SELECT pg_advisory_xact_lock(hashtext('tasklease schema ' || %s))", (schema,)
        )
        connection.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {s}").format(s=s))
        connection.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {s}.schema_version "
                "(component text PRIMARY KEY, version integer NOT NULL)"
            ).format(s=s)
        )
        row = connection.execute(
            sql.SQL("SELECT version FROM {s}.schema_version WHERE component = 'store'").format(s=s)
        ).fetchone()
        version = row[0] if row else 0
        if version > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"Postgres schema {schema!r} has version {version}; this tasklease knows "
                f"{SCHEMA_VERSION}: upgrade tasklease"
            )
        for step in _MIGRATIONS[version:]:
            for statement in step:
                connection.execute(sql.SQL(statement).format(s=s))
        connection.execute(
            sql.SQL(
                "INSERT INTO {s}.schema_version (component, version) VALUES ('store', %s) "
                "ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version"
            ).format(s=s),
            (SCHEMA_VERSION,),
        )


def encode_run(record: RunRecord) -> list[Any]:
    """The record's column values, in :data:`RUN_COLUMNS` order."""
    return _RUNS.encode(record)


def encode_run_changes(before: RunRecord, after: RunRecord) -> tuple[tuple[str, ...], list[Any]]:
    """The columns and values ``after`` changes from ``before`` (:meth:`RecordCodec.
    encode_changed`)."""
    return _RUNS.encode_changed(before, after)


def decode_run(row: tuple[Any, ...] | list[Any]) -> RunRecord:
    """The record of a row whose first columns are :data:`RUN_COLUMNS`."""
    return _RUNS.decode(row)


def scan_runs(
    list_runs: str, filters: RunFilter, after: Position | None, limit: int
) -> tuple[str, list[Any]]:
    """The statement (``list_runs`` and its clauses) and parameters of a filtered page of
    runs, newest first, after ``after``."""
    clauses: list[str] = []
    params: list[Any] = []
    status = filters.status_to_scan
    for column, value in (
        ("status", status.value if status else None),
        ("handler", filters.handler),
        ("kind", filters.kind),
    ):
        if value is not None:
            clauses.append(f"{column} = %s")
            params.append(value)
    if filters.older_than is not None:
        clauses.append("claimed_at < %s")
        params.append(filters.older_than)
    if filters.newer_than is not None:
        clauses.append("claimed_at >= %s")
        params.append(filters.newer_than)
    if after is not None:
        clauses.append("(claimed_at, run_id) < (%s, %s)")
        params.extend(after)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    order = " ORDER BY claimed_at DESC, run_id DESC LIMIT %s"
    return f"{list_runs}{where}{order}", [*params, limit]


def encode_lock(lock: LockRecord) -> list[Any]:
    """The lock's column values (:data:`LOCK_COLUMNS`, then ``lapses_at``)."""
    return [*_LOCKS.encode(lock), locking.lapses_at(lock)]


def decode_lock(row: tuple[Any, ...] | list[Any]) -> LockRecord:
    return _LOCKS.decode(row)


class Statements:
    """Every statement the store sends, composed once for its schema."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        s = sql.Identifier(schema)
        run_cols = sql.SQL(", ").join(map(sql.Identifier, RUN_COLUMNS))
        run_values = sql.SQL(", ").join(sql.Placeholder() * len(RUN_COLUMNS))
        run_set = sql.SQL(", ").join(
            sql.SQL("{c} = {p}").format(c=sql.Identifier(c), p=sql.Placeholder())
            for c in RUN_COLUMNS[1:]
        )
        lock_names = (*LOCK_COLUMNS, "lapses_at")
        lock_cols = sql.SQL(", ").join(map(sql.Identifier, LOCK_COLUMNS))
        lock_all = sql.SQL(", ").join(map(sql.Identifier, lock_names))
        lock_values = sql.SQL(", ").join(sql.Placeholder() * len(lock_names))
        lock_set = sql.SQL(", ").join(
            sql.SQL("{c} = {p}").format(c=sql.Identifier(c), p=sql.Placeholder())
            for c in lock_names[1:]
        )

        def text(template: LiteralString, **parts: sql.Composable) -> str:
            # Composed from constant identifiers only; every value stays a parameter.
            composed = sql.SQL(template).format(s=s, **parts)
            return composed.as_string(None)

        cols = {"cols": run_cols}
        self.select_run = text("SELECT {cols}, version FROM {s}.runs WHERE run_id = %s", **cols)
        # A transactional step's read of its run, in the step's transaction, after its writes.
        self.lock_run = text(
            "SELECT {cols}, version FROM {s}.runs WHERE run_id = %s FOR UPDATE", **cols
        )
        # One round trip: a first claim inserts (and gets its version and the server's time
        # back, its columns NULL: the claimer holds the record); a duplicate gets the stored
        # row and the server's time instead.
        nulls = sql.SQL(", ").join(sql.SQL("NULL") for _ in RUN_COLUMNS)
        self.claim = text(
            "WITH ins AS (INSERT INTO {s}.runs ({cols}, version) VALUES ({values}, 1) "
            "ON CONFLICT (run_id) DO NOTHING RETURNING version) "
            "SELECT true, {nulls}, version, statement_timestamp() FROM ins UNION ALL "
            "SELECT false, {cols}, version, statement_timestamp() FROM {s}.runs "
            "WHERE run_id = %s AND NOT EXISTS (SELECT FROM ins)",
            values=run_values,
            nulls=nulls,
            **cols,
        )
        # One row whether or not the run exists: its columns (NULL: absent) and the time.
        self.read_run = text(
            "SELECT {cols}, version, statement_timestamp() FROM (VALUES (1)) AS one "
            "LEFT JOIN {s}.runs ON run_id = %s",
            **cols,
        )
        self.insert_run = text(
            "INSERT INTO {s}.runs ({cols}, version) VALUES ({values}, 1) "
            "ON CONFLICT (run_id) DO NOTHING RETURNING version",
            values=run_values,
            **cols,
        )
        self.update_run = text(
            "UPDATE {s}.runs SET {set}, version = version + 1 "
            "WHERE run_id = %s AND version = %s RETURNING version",
            set=run_set,
        )
        self._update_columns: dict[tuple[str, ...], str] = {}
        # A transactional handler's completion, conditional on the attempt holding the claim
        # (decisions.holds), at the time given or the server's; kept as decisions.kept does.
        # Not held: division by zero, which aborts the transaction, so that a COMMIT sent in
        # the same pipeline rolls the handler's writes back (one round trip, no read first).
        self.complete_held = text(
            "WITH at AS (SELECT COALESCE(%s::timestamptz, statement_timestamp()) AS now), "
            "done AS (UPDATE {s}.runs SET status = %s, result_json = %s, "
            "finished_at = (SELECT now FROM at), expire_at = GREATEST(expire_at, "
            "(SELECT now FROM at) + %s::interval, lease_expires + %s::interval), "
            "version = version + 1 "
            "WHERE run_id = %s AND attempt_id = %s AND status = %s RETURNING version) "
            "SELECT (SELECT version FROM done), 1 / (SELECT count(*)::integer FROM done)"
        )
        self.list_runs = text("SELECT {cols} FROM {s}.runs", **cols)
        self._text = text
        self.purge_runs = text(
            "DELETE FROM {s}.runs WHERE expire_at <= %s AND run_id IN "
            "(SELECT run_id FROM {s}.runs WHERE expire_at <= %s ORDER BY expire_at LIMIT %s)"
        )
        self.now = "SELECT statement_timestamp()"
        self.read_lock = text(
            "SELECT {cols}, version, statement_timestamp() FROM (VALUES (1)) AS one "
            "LEFT JOIN {s}.locks ON name = %s",
            cols=lock_cols,
        )
        self.insert_lock = text(
            "INSERT INTO {s}.locks ({cols}, version) VALUES ({values}, 1) "
            "ON CONFLICT (name) DO NOTHING RETURNING version",
            cols=lock_all,
            values=lock_values,
        )
        self.update_lock = text(
            "UPDATE {s}.locks SET {set}, version = version + 1 "
            "WHERE name = %s AND version = %s RETURNING version",
            set=lock_set,
        )
        self.list_locks = text(
            "SELECT {cols} FROM {s}.locks ORDER BY started_at DESC, name DESC LIMIT %s",
            cols=lock_cols,
        )
        self.get_lock = text("SELECT {cols} FROM {s}.locks WHERE name = %s", cols=lock_cols)
        self.purge_locks = text(
            "DELETE FROM {s}.locks WHERE lapses_at <= %s AND name IN "
            "(SELECT name FROM {s}.locks WHERE lapses_at <= %s ORDER BY lapses_at LIMIT %s)"
        )

    def update_columns(self, columns: tuple[str, ...]) -> str:
        """``update_run`` setting only ``columns`` (of :data:`RUN_COLUMNS`): a write
        conditional on the version of a row whose record the store holds sends only what
        it changes. Composed once per set of columns (few: a finish, a renewal, ...).

        Conditional on the attempt id the row held too: a row purged and inserted again
        starts its versions at 1 anew, so a version remembered from the old row may match
        the new one, whose attempt id never equals the old row's (one attempt, one claim)."""
        statement = self._update_columns.get(columns)
        if statement is None:
            assigned: list[sql.Composable] = [
                sql.SQL("{c} = {p}").format(c=sql.Identifier(c), p=sql.Placeholder())
                for c in columns
            ]
            assigned.append(sql.SQL("version = version + 1"))
            statement = self._text(
                "UPDATE {s}.runs SET {set} "
                "WHERE run_id = %s AND version = %s AND attempt_id = %s RETURNING version",
                set=sql.SQL(", ").join(assigned),
            )
            self._update_columns[columns] = statement
        return statement
