"""The generic record codec stores exactly what each store's hand-written mapping stored.

Existing databases must keep working: records written in the old format (literal column and
field names and encodings below, as the stores wrote them before the codec) read back
unchanged, and what the stores write now is that same format.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tasklease.worker.core import locking
from tasklease.worker.core.records import LockRecord, RunRecord, RunStatus
from tasklease.worker.stores import SqliteStore
from tests.support.helpers import T0

RECORD = RunRecord(
    run_id="run-1",
    kind="task",
    handler="send",
    status=RunStatus.COMPLETED,
    attempt_id="attempt-2",
    fencing_token=2,
    attempts=2,
    lease_expires=T0 + timedelta(minutes=5, microseconds=7),
    expire_at=T0 + timedelta(days=7),
    claimed_at=T0,
    identity={"queue": "default", "task_name": "t-1"},
    finished_at=T0 + timedelta(seconds=3),
    result_json='{"sent":true}',
    error=None,
    payload='{"to":"a"}',
    caller="sa@example.com",
    replay_of="run-0",
    replayed_as=None,
)
LOCK = LockRecord(
    name="job/nightly",
    holder_run_id="run-1",
    holder_attempt_id="attempt-2",
    fencing_token=1_792_152_000_000_000,
    started_at=T0,
    lease_expires=T0 + timedelta(minutes=5),
    safety_expires=T0 + timedelta(hours=1),
    next_start_at=T0,
    released_at=None,
)
OLD_SQLITE_COLUMNS = (
    "run_id, kind, handler, status, attempt_id, fencing_token, attempts, lease_expires_us, "
    "expire_at_us, claimed_at_us, finished_at_us, identity, result, error, payload, caller, "
    "replay_of, replayed_as"
)
OLD_SQLITE_LOCK_COLUMNS = (
    "name, holder_run_id, holder_attempt_id, fencing_token, started_at_us, lease_expires_us, "
    "safety_expires_us, next_start_at_us, released_at_us, lapses_at_us"
)


def _us(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _old_sqlite_row(record: RunRecord) -> tuple[object, ...]:
    assert record.finished_at is not None
    return (
        record.run_id, record.kind, record.handler, record.status.value, record.attempt_id,
        record.fencing_token, record.attempts, _us(record.lease_expires), _us(record.expire_at),
        _us(record.claimed_at), _us(record.finished_at),
        json.dumps(record.identity, sort_keys=True), record.result_json, record.error,
        record.payload, record.caller, record.replay_of, record.replayed_as,
    )  # fmt: skip


def test_sqlite_reads_a_run_and_a_lock_written_in_the_old_format(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    created = SqliteStore(path)
    assert created.get("run-1") is None  # Creates the schema.
    created.close()
    with sqlite3.connect(path) as connection:
        connection.execute(
            f"INSERT INTO runs ({OLD_SQLITE_COLUMNS}) VALUES ({', '.join('?' * 18)})",
            _old_sqlite_row(RECORD),
        )
        null_result = (*_old_sqlite_row(RECORD.replace(run_id="run-v1"))[:12], "null")
        connection.execute(
            f"INSERT INTO runs ({OLD_SQLITE_COLUMNS}) VALUES ({', '.join('?' * 18)})",
            (*null_result, *_old_sqlite_row(RECORD)[13:]),
        )
        connection.execute(
            f"INSERT INTO locks ({OLD_SQLITE_LOCK_COLUMNS}) VALUES ({', '.join('?' * 10)})",
            ("job/nightly", "run-1", "attempt-2", LOCK.fencing_token, _us(T0),
             _us(LOCK.lease_expires), _us(LOCK.safety_expires), _us(T0), None,
             _us(locking.lapses_at(LOCK))),
        )  # fmt: skip
    connection.close()
    store = SqliteStore(path)
    assert store.get("run-1") == RECORD
    assert store.get("run-v1") == RECORD.replace(run_id="run-v1", result_json=None)
    assert store.get_lock("job/nightly") == LOCK
    store.close()


def test_sqlite_writes_the_old_format(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    store._read_modify_write("run-1", lambda _: (RECORD, None))
    store._read_modify_write_lock("job/nightly", lambda _lock, _read: (LOCK, None))
    store.close()
    with sqlite3.connect(path) as connection:
        row = connection.execute(f"SELECT {OLD_SQLITE_COLUMNS} FROM runs").fetchone()
        lock = connection.execute(f"SELECT {OLD_SQLITE_LOCK_COLUMNS} FROM locks").fetchone()
    connection.close()
    assert row == _old_sqlite_row(RECORD)
    assert lock == (
        "job/nightly", "run-1", "attempt-2", LOCK.fencing_token, _us(T0),
        _us(LOCK.lease_expires), _us(LOCK.safety_expires), _us(T0), None,
        _us(locking.lapses_at(LOCK)),
    )  # fmt: skip


def _old_firestore_document(record: RunRecord) -> dict[str, object]:
    return {
        "kind": record.kind,
        "handler": record.handler,
        "status": record.status.value,
        "attempt_id": record.attempt_id,
        "fencing_token": record.fencing_token,
        "attempts": record.attempts,
        "lease_expires": record.lease_expires,
        "expire_at": record.expire_at,
        "claimed_at": record.claimed_at,
        "finished_at": record.finished_at,
        "identity": dict(record.identity),
        "result": record.result_json,
        "error": record.error,
        "payload": record.payload,
        "caller": record.caller,
        "replay_of": record.replay_of,
        "replayed_as": record.replayed_as,
    }


def test_firestore_documents_keep_their_field_names_and_old_ones_read_back() -> None:
    pytest.importorskip("google.cloud.firestore")
    from tasklease.worker.stores.firestore import codec as firestore_codec  # noqa: PLC0415
    from tasklease.worker.stores.firestore import locks as firestore_locks  # noqa: PLC0415

    # Durable steps added two fields, waits and cancellation three; a document written
    # before them reads back without.
    assert firestore_codec.encode_run(RECORD) == {
        **_old_firestore_document(RECORD),
        "steps_json": None,
        "continuation_json": None,
        "waits_json": None,
        "cancelled_by": None,
        "cancelled_at": None,
    }
    assert firestore_codec.decode_run("run-1", _old_firestore_document(RECORD)) == RECORD
    # Written before caller and the replay links existed: those read as None.
    older = {
        key: value
        for key, value in _old_firestore_document(RECORD).items()
        if key not in ("caller", "replay_of", "replayed_as")
    }
    assert firestore_codec.decode_run("run-1", older) == RECORD.replace(caller=None, replay_of=None)
    old_lock = {
        "name": LOCK.name,
        "holder_run_id": LOCK.holder_run_id,
        "holder_attempt_id": LOCK.holder_attempt_id,
        "fencing_token": LOCK.fencing_token,
        "started_at": LOCK.started_at,
        "lease_expires": LOCK.lease_expires,
        "safety_expires": LOCK.safety_expires,
        "next_start_at": LOCK.next_start_at,
        "released_at": LOCK.released_at,
        "lapses_at": locking.lapses_at(LOCK),
    }
    assert firestore_locks.encode(LOCK) == old_lock
    assert firestore_locks.decode("job/nightly", old_lock) == LOCK


def test_postgres_columns_are_the_field_names_of_the_tables_created() -> None:
    pytest.importorskip("psycopg")
    from tasklease.worker.stores.postgres import schema as postgres_schema  # noqa: PLC0415

    assert postgres_schema.RUN_COLUMNS == (
        "run_id", "kind", "handler", "status", "attempt_id", "fencing_token", "attempts",
        "lease_expires", "expire_at", "claimed_at", "identity", "finished_at", "result_json",
        "error", "payload", "caller", "replay_of", "replayed_as", "steps_json",
        "continuation_json", "waits_json", "cancelled_by", "cancelled_at",
    )  # fmt: skip
    assert postgres_schema.LOCK_COLUMNS == (
        "name", "holder_run_id", "holder_attempt_id", "fencing_token", "started_at",
        "lease_expires", "safety_expires", "next_start_at", "released_at",
    )  # fmt: skip


def test_encode_changed_gives_only_the_fields_that_differ_encoded_as_stored() -> None:
    from tasklease.worker.stores.base.codec import Conversion, RecordCodec  # noqa: PLC0415

    codec = RecordCodec(RunRecord, time=Conversion(encode=datetime.isoformat))
    done = dataclasses.replace(
        RECORD, status=RunStatus.FAILED, finished_at=None, error="boom", result_json=None
    )
    assert codec.encode_changed(RECORD, done) == (
        ("status", "finished_at", "result_json", "error"),
        ["failed", None, None, "boom"],
    )
    later = dataclasses.replace(RECORD, lease_expires=RECORD.lease_expires + timedelta(seconds=1))
    assert codec.encode_changed(RECORD, later) == (
        ("lease_expires",),
        [later.lease_expires.isoformat()],
    )
    assert codec.encode_changed(RECORD, dataclasses.replace(RECORD)) == ((), [])
