"""The SQLite store's tables: the schema and its migrations, and how a run's record becomes
a row of ``runs`` and back (the ``locks`` rows: :mod:`.locks`; the tally's: :mod:`.tally`).

Times are integer microseconds in ``<field>_us`` columns, the identity JSON text.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from tasklease.errors import StoreUnavailable
from tasklease.worker.core.records import RunRecord
from tasklease.worker.stores.base.codec import Conversion, RecordCodec
from tasklease.worker.stores.sqlite import fan_ins, locks

__all__ = [
    "INSERT",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SELECT",
    "SELECT_ONE",
    "UPDATE",
    "decode_run",
    "migrate",
    "read_row",
    "write_run",
]

Row = tuple[Any, ...]

SCHEMA_VERSION = 3  # 2: runs.caller; 3: the locks table (exclusive jobs, concurrency keys).
SCHEMA = """
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
    continuation_json TEXT,
    waits_json TEXT,
    cancelled_by TEXT,
    cancelled_at_us INTEGER
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
# clears) them: operators' replay links, a run's durable steps (an older tasklease
# rewriting a run drops its steps: its retry then runs them again, as that version would),
# its waits and signals, and its cancellation.
_ADDED_COLUMNS = {
    "replay_of": "TEXT",
    "replayed_as": "TEXT",
    "steps_json": "TEXT",
    "continuation_json": "TEXT",
    "waits_json": "TEXT",
    "cancelled_by": "TEXT",
    "cancelled_at_us": "INTEGER",
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
SELECT = f"SELECT {_COLUMNS} FROM runs"  # noqa: S608
SELECT_ONE = f"{SELECT} WHERE run_id = ?"
_PLACEHOLDERS = ", ".join("?" * len(_COLUMNS.split(", ")))
INSERT = f"INSERT INTO runs ({_COLUMNS}) VALUES ({_PLACEHOLDERS})"  # noqa: S608
# A run's record changes in place. Its run id, kind, handler and identity never change (the
# run id is their hash), so they stay out of the SET: SQLite updates only the indexes on
# columns an UPDATE names, and the handler and identity indexes then cost nothing.
_FIXED = ("run_id", "kind", "handler", "identity")
_STATE = [column for column in _COLUMNS.split(", ") if column not in _FIXED]
UPDATE = (
    f"UPDATE runs SET {', '.join(f'{column} = ?' for column in _STATE)} "  # noqa: S608
    "WHERE run_id = ?"
)
_STATE_AT = [_COLUMNS.split(", ").index(column) for column in _STATE]
_IDENTITY_AT = [_COLUMNS.split(", ").index(column) for column in _FIXED]


def migrate(connection: sqlite3.Connection, path: Path) -> None:
    """Bring the file's schema to :data:`SCHEMA_VERSION` in one write transaction; refuse a
    file a newer tasklease wrote."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"{path} has schema version {version}; this tasklease knows "
                f"{SCHEMA_VERSION}: upgrade tasklease"
            )
        if version == 1:  # Version 2 added the caller column.
            connection.execute("ALTER TABLE runs ADD COLUMN caller TEXT")
        for statement in filter(str.strip, (SCHEMA + ";" + fan_ins.SCHEMA).split(";")):
            connection.execute(statement)
        _add_missing_columns(connection)
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


def _add_missing_columns(connection: sqlite3.Connection) -> None:
    present = {row[1] for row in connection.execute("PRAGMA table_info(runs)")}
    for name, kind in _ADDED_COLUMNS.items():
        if name not in present:  # Constant names and types only: nothing from outside.
            connection.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")


def read_row(connection: sqlite3.Connection, run_id: str) -> Row | None:
    """The run's row as stored (for :func:`write_run`), or None."""
    row: Row | None = connection.execute(SELECT_ONE, (run_id,)).fetchone()
    return row


def write_run(connection: sqlite3.Connection, old: Row | None, record: RunRecord) -> None:
    """Insert ``record``, or update the state of its row ``old`` in place."""
    new = tuple(_CODEC.encode(record))
    if old is None:
        connection.execute(INSERT, new)
    elif all(old[index] == new[index] for index in _IDENTITY_AT):
        connection.execute(UPDATE, [*(new[index] for index in _STATE_AT), new[0]])
    else:  # Never for records this store wrote; kept correct for any other writer's.
        connection.execute("DELETE FROM runs WHERE run_id = ?", (new[0],))
        connection.execute(INSERT, new)


def decode_run(row: Row) -> RunRecord:
    return _CODEC.decode(row)
