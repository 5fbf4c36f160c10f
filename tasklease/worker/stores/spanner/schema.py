"""The Spanner store's tables: their DDL, and how records become rows and back.

The tables of a store: ``<table>`` (one row per run, keyed by the run id, already a hash, so
writes spread over splits), ``<table>_locks`` (one row per lock, keyed by the hashed lock
name), ``<table>_fan_ins`` (one row per join, keyed by the join id, a hash too) with
``<table>_fan_in_entries`` interleaved in it (one row per counted child: :mod:`.fan_ins` says
why), and the delivery tally (:mod:`.tally`). Runs, locks and joins have a row deletion policy
(Spanner's TTL) on the time after which the row decides nothing: ``expire_at`` for runs and
joins (a join's entries go with it), ``lapses_at`` for locks. Spanner deletes such rows within
about three days; until then the rules treat them as absent (:func:`decisions.is_live`).

``committed_at`` is the commit timestamp of the row's last write (Spanner's TrueTime, not an
instance's clock). The rules never read it; beside ``finished_at`` (or the ``claimed_at`` of a
run not finished yet), written from the writing instance's clock in the same commit, it shows
how far that clock was off.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from tasklease.worker.core import locking
from tasklease.worker.core.records import LockRecord, RunRecord, RunStatus
from tasklease.worker.stores.spanner import tally

RUN_COLUMNS = (
    "run_id", "kind", "handler", "status", "attempt_id", "fencing_token", "attempts",
    "lease_expires", "expire_at", "claimed_at", "finished_at", "identity", "result", "error",
    "payload", "caller", "replay_of", "replayed_as", "steps_json", "continuation_json",
    "waits_json", "cancelled_by", "cancelled_at",
)  # fmt: skip
# Written beside the record's own columns: the identity fields runs are looked up by, and the
# commit timestamp.
WRITE_COLUMNS = (*RUN_COLUMNS, "task_name", "job_name", "committed_at")
LOCK_COLUMNS = (
    "name", "holder_run_id", "holder_attempt_id", "fencing_token", "started_at",
    "lease_expires", "safety_expires", "next_start_at", "released_at",
)  # fmt: skip
LOCK_WRITE_COLUMNS = ("lock_id", *LOCK_COLUMNS, "lapses_at", "committed_at")


def ddl(table: str) -> list[str]:
    """The statements creating ``table`` and its locks table, each a no-op when present.

    Indexes serve the operators' listings (by status or handler, newest claim first) and
    look-ups by task or job name (NULL_FILTERED: a run has one of the two, never both).
    """
    locks = f"{table}_locks"
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
            run_id STRING(MAX) NOT NULL,
            kind STRING(64) NOT NULL,
            handler STRING(MAX) NOT NULL,
            status STRING(32) NOT NULL,
            attempt_id STRING(MAX) NOT NULL,
            fencing_token INT64 NOT NULL,
            attempts INT64 NOT NULL,
            lease_expires TIMESTAMP NOT NULL,
            expire_at TIMESTAMP NOT NULL,
            claimed_at TIMESTAMP NOT NULL,
            finished_at TIMESTAMP,
            identity STRING(MAX) NOT NULL,
            result STRING(MAX),
            error STRING(MAX),
            payload STRING(MAX),
            caller STRING(MAX),
            replay_of STRING(MAX),
            replayed_as STRING(MAX),
            steps_json STRING(MAX),
            continuation_json STRING(MAX),
            waits_json STRING(MAX),
            cancelled_by STRING(MAX),
            cancelled_at TIMESTAMP,
            task_name STRING(MAX),
            job_name STRING(MAX),
            committed_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true)
        ) PRIMARY KEY (run_id),
        ROW DELETION POLICY (OLDER_THAN(expire_at, INTERVAL 0 DAY))""",
        f"CREATE INDEX IF NOT EXISTS {table}_by_status ON {table} (status, claimed_at DESC)",
        f"CREATE INDEX IF NOT EXISTS {table}_by_handler ON {table} (handler, claimed_at DESC)",
        f"CREATE NULL_FILTERED INDEX IF NOT EXISTS {table}_by_task ON {table} (task_name)",
        f"CREATE NULL_FILTERED INDEX IF NOT EXISTS {table}_by_job ON {table} (job_name)",
        f"""CREATE TABLE IF NOT EXISTS {locks} (
            lock_id STRING(64) NOT NULL,
            name STRING(MAX) NOT NULL,
            holder_run_id STRING(MAX) NOT NULL,
            holder_attempt_id STRING(MAX) NOT NULL,
            fencing_token INT64 NOT NULL,
            started_at TIMESTAMP NOT NULL,
            lease_expires TIMESTAMP NOT NULL,
            safety_expires TIMESTAMP NOT NULL,
            next_start_at TIMESTAMP NOT NULL,
            released_at TIMESTAMP,
            lapses_at TIMESTAMP NOT NULL,
            committed_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true)
        ) PRIMARY KEY (lock_id),
        ROW DELETION POLICY (OLDER_THAN(lapses_at, INTERVAL 0 DAY))""",
        tally.ddl(table),
        *fan_in_ddl(table),
    ]


def fan_in_tables(table: str) -> tuple[str, str]:
    """The joins' table and their entries' table beside the runs table ``table``."""
    return f"{table}_fan_ins", f"{table}_fan_in_entries"


def fan_in_ddl(table: str) -> list[str]:
    """The joins' table, the index listing a parent's joins, and the entries' table,
    interleaved in the joins' (deleted with their join, by its row deletion policy too)."""
    joins, entries = fan_in_tables(table)
    return [
        f"""CREATE TABLE IF NOT EXISTS {joins} (
            join_id STRING(64) NOT NULL,
            parent_run_id STRING(MAX) NOT NULL,
            then_handler STRING(MAX) NOT NULL,
            expected INT64 NOT NULL,
            completed INT64 NOT NULL,
            failed INT64 NOT NULL,
            created_at TIMESTAMP NOT NULL,
            expire_at TIMESTAMP NOT NULL,
            then_enqueued_at TIMESTAMP
        ) PRIMARY KEY (join_id),
        ROW DELETION POLICY (OLDER_THAN(expire_at, INTERVAL 0 DAY))""",
        f"CREATE INDEX IF NOT EXISTS {joins}_by_parent ON {joins} (parent_run_id, created_at DESC)",
        f"""CREATE TABLE IF NOT EXISTS {entries} (
            join_id STRING(64) NOT NULL,
            child_key STRING(MAX) NOT NULL,
            run_id STRING(MAX) NOT NULL,
            status STRING(32) NOT NULL,
            finished_at TIMESTAMP NOT NULL,
            result STRING(MAX),
            error STRING(MAX)
        ) PRIMARY KEY (join_id, child_key),
        INTERLEAVE IN PARENT {joins} ON DELETE CASCADE""",
    ]


def objects(table: str) -> set[str]:
    """The tables and indexes :func:`ddl` creates, as INFORMATION_SCHEMA names them."""
    return {
        table,
        f"{table}_locks",
        tally.table_of(table),
        *(f"{table}_by_{what}" for what in ("status", "handler", "task", "job")),
        *fan_in_tables(table),
        f"{table}_fan_ins_by_parent",
    }


def encode_run(record: RunRecord, commit_timestamp: object) -> list[Any]:
    """The row of ``record``, in :data:`WRITE_COLUMNS` order."""
    return [
        record.run_id,
        record.kind,
        record.handler,
        record.status.value,
        record.attempt_id,
        record.fencing_token,
        record.attempts,
        record.lease_expires,
        record.expire_at,
        record.claimed_at,
        record.finished_at,
        json.dumps(record.identity, sort_keys=True),
        record.result_json,
        record.error,
        record.payload,
        record.caller,
        record.replay_of,
        record.replayed_as,
        record.steps_json,
        record.continuation_json,
        record.waits_json,
        record.cancelled_by,
        record.cancelled_at,
        record.identity.get("task_name"),
        record.identity.get("job_name"),
        commit_timestamp,
    ]


def decode_run(row: list[Any]) -> RunRecord:
    """A row read with :data:`RUN_COLUMNS` as a record."""
    (run_id, kind, handler, status, attempt_id, fencing_token, attempts, lease_expires,
     expire_at, claimed_at, finished_at, identity, result, error, payload, caller,
     replay_of, replayed_as, steps_json, continuation_json, waits_json, cancelled_by,
     cancelled_at) = row  # fmt: skip
    return RunRecord(
        run_id=run_id,
        kind=kind,
        handler=handler,
        status=RunStatus(status),
        attempt_id=attempt_id,
        fencing_token=int(fencing_token),
        attempts=int(attempts),
        lease_expires=utc(lease_expires),
        expire_at=utc(expire_at),
        claimed_at=utc(claimed_at),
        finished_at=None if finished_at is None else utc(finished_at),
        identity=json.loads(identity),
        result_json=result,
        error=error,
        payload=payload,
        caller=caller,
        replay_of=replay_of,
        replayed_as=replayed_as,
        steps_json=steps_json,
        continuation_json=continuation_json,
        waits_json=waits_json,
        cancelled_by=cancelled_by,
        cancelled_at=None if cancelled_at is None else utc(cancelled_at),
    )


# Columns added to the runs table since it was first created: added when missing.
ADDED_COLUMNS = {
    "steps_json": "STRING(MAX)",
    "continuation_json": "STRING(MAX)",
    "waits_json": "STRING(MAX)",
    "cancelled_by": "STRING(MAX)",
    "cancelled_at": "TIMESTAMP",
}


def added_columns_ddl(table: str, present: set[str]) -> list[str]:
    """The statements adding the :data:`ADDED_COLUMNS` missing from ``present``."""
    return [
        f"ALTER TABLE {table} ADD COLUMN {name} {kind}"
        for name, kind in ADDED_COLUMNS.items()
        if name not in present
    ]


def encode_lock(lock: LockRecord, commit_timestamp: object) -> list[Any]:
    """The row of ``lock``, in :data:`LOCK_WRITE_COLUMNS` order."""
    return [
        locking.lock_id(lock.name),
        lock.name,
        lock.holder_run_id,
        lock.holder_attempt_id,
        lock.fencing_token,
        lock.started_at,
        lock.lease_expires,
        lock.safety_expires,
        lock.next_start_at,
        lock.released_at,
        # From then on the row decides nothing: the row deletion policy may delete it.
        locking.lapses_at(lock),
        commit_timestamp,
    ]


def decode_lock(row: list[Any]) -> LockRecord:
    """A row read with :data:`LOCK_COLUMNS` as a lock."""
    (name, run_id, attempt_id, token, started_at, lease_expires, safety_expires, next_start_at,
     released_at) = row  # fmt: skip
    return LockRecord(
        name=name,
        holder_run_id=run_id,
        holder_attempt_id=attempt_id,
        fencing_token=int(token),
        started_at=utc(started_at),
        lease_expires=utc(lease_expires),
        safety_expires=utc(safety_expires),
        next_start_at=utc(next_start_at),
        released_at=None if released_at is None else utc(released_at),
    )


def utc(moment: datetime) -> datetime:
    """A plain UTC datetime (the client returns DatetimeWithNanoseconds; microseconds kept:
    the store writes microseconds, so nothing finer is ever stored)."""
    return datetime(
        moment.year,
        moment.month,
        moment.day,
        moment.hour,
        moment.minute,
        moment.second,
        moment.microsecond,
        tzinfo=UTC,
    )
