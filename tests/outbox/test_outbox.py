"""Transactional enqueue: entries staged through the caller's transaction, relayed after commit."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.orm import Session

from tasklease.cli import main
from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import NotInTransaction, Relay, relay_producer
from tasklease.producer import task_id
from tests.support.outbox import (
    Outboxes,
    drain_at_once,
    pg_connect,
    producer,
    relay_env,
    sqlite_app_db,
    task_names,
)


def test_a_committed_enqueue_is_created_by_the_relay_under_the_producers_own_name(
    tmp_path: Path, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("INSERT INTO orders VALUES ('42')")
    result = producer(tasks.url).enqueue("send_receipt", {"order": 42}, key="o42", transaction=conn)
    assert result.staged and not result.created
    assert task_names(tasks) == []  # Nothing sent before the relay, even after the commit.
    conn.commit()
    db, relay = outboxes.relay_for(url, tasks)
    assert relay.drain().sent == 1
    assert task_names(tasks) == [task_id("send_receipt", "o42")]
    assert db.status(0).depth == 0 and db.status(0).sent == 1


def test_a_rolled_back_enqueue_leaves_no_entry_and_no_task(
    tmp_path: Path, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("INSERT INTO orders VALUES ('1')")
    producer(tasks.url).enqueue("send_receipt", {}, key="o1", transaction=conn)
    conn.rollback()
    _db, relay = outboxes.relay_for(url, tasks)
    assert relay.drain().claimed == 0
    assert task_names(tasks) == []


def test_the_same_key_staged_twice_is_one_entry_and_a_re_send_is_absorbed(
    tmp_path: Path, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    make = producer(tasks.url)
    for _ in range(2):
        conn.execute("BEGIN")
        staged = make.enqueue("send_receipt", {}, key="same", transaction=conn).staged
        conn.commit()
    assert staged is False
    _db, relay = outboxes.relay_for(url, tasks)
    relay.drain()
    # A relay that died before marking sent: the entry is pending again, its re-send absorbed.
    with sqlite3.connect(tmp_path / "app.db") as raw:
        raw.execute("UPDATE tasklease_outbox SET state = 'pending', next_attempt_at = 0")
    assert relay.drain().sent == 1
    assert len(task_names(tasks)) == 1


def test_without_a_key_the_entry_keeps_its_generated_name_for_every_re_send(
    tmp_path: Path, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("BEGIN")
    staged = producer(tasks.url).enqueue("send_receipt", {}, transaction=conn)
    conn.commit()
    _db, relay = outboxes.relay_for(url, tasks)
    relay.drain()
    with sqlite3.connect(tmp_path / "app.db") as raw:
        raw.execute("UPDATE tasklease_outbox SET state = 'pending', next_attempt_at = 0")
    relay.drain()
    assert task_names(tasks) == [staged.task_id]


def test_enqueue_many_and_fan_out_stage_every_item_through_the_transaction(
    tmp_path: Path, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("BEGIN")
    make = producer(tasks.url)
    many = make.enqueue_many("record", [(f"k{n}", {"n": n}) for n in range(5)], transaction=conn)

    class Run:
        run_id = "nightly/2026-12-01"

    fanned = make.fan_out(Run(), "record", [("a", {}), ("b", {})], transaction=conn)
    conn.commit()
    assert all(r.staged for r in [*many, *fanned])
    _db, relay = outboxes.relay_for(url, tasks)
    assert relay.drain().sent == 7
    assert len(task_names(tasks)) == 7


def test_a_sqlite_connection_outside_a_transaction_is_refused(tmp_path: Path) -> None:
    sqlite_app_db(tmp_path / "app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    with pytest.raises(NotInTransaction, match="not in a transaction"):
        producer("http://127.0.0.1:9").enqueue("x", {}, key="k", transaction=conn)
    assert conn.execute("SELECT COUNT(*) FROM tasklease_outbox").fetchone() == (0,)


def test_an_unsupported_transaction_object_is_a_type_error_naming_the_supported_ones() -> None:
    with pytest.raises(TypeError, match=r"sqlite3\.Connection.*psycopg.*sqlalchemy"):
        producer("http://127.0.0.1:9").enqueue("x", {}, key="k", transaction=object())


def test_a_poison_entry_is_marked_failed_with_its_reason_and_never_blocks_the_others(
    tmp_path: Path,
    tasks: CloudTasksEmulator,
    capsys: pytest.CaptureFixture[str],
    outboxes: Outboxes,
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("BEGIN")
    make = producer(tasks.url)
    make.enqueue("record", {}, key="good-1", transaction=conn)
    make.enqueue("record", {}, key="poison", queue="no-such-queue", transaction=conn)
    make.enqueue("record", {}, key="good-2", transaction=conn)
    conn.commit()
    _db, relay = outboxes.relay_for(url, tasks)
    done = relay.drain()
    assert (done.sent, done.failed) == (2, 1)
    assert len(task_names(tasks)) == 2
    assert main(["outbox", "status", "--url", url]) == 1
    out = capsys.readouterr().out
    assert "pending 0" in out and "failed 1" in out
    assert "no-such-queue" in out and "NOT_FOUND" in out.upper().replace(" ", "_")


def test_while_cloud_tasks_is_down_entries_back_off_and_none_is_marked_sent(
    tmp_path: Path, outboxes: Outboxes
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("BEGIN")
    producer("http://127.0.0.1:9").enqueue_many(
        "record", [(f"k{n}", {}) for n in range(3)], transaction=conn
    )
    conn.commit()
    db = outboxes.open(url)
    relay = Relay(db, relay_producer(relay_env("http://127.0.0.1:9")))
    done = relay.drain()
    assert (done.sent, done.retrying) == (0, 3)
    status = db.status(0)
    assert status.sent == 0 and status.depth == 3 and status.retrying == 3
    assert relay.drain().claimed == 0  # Backing off: not due yet.


def test_migrate_creates_the_table_and_print_shows_the_sql(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], outboxes: Outboxes
) -> None:
    assert main(["outbox", "migrate", "--print", "postgresql"]) == 0
    assert "CREATE TABLE IF NOT EXISTS tasklease_outbox" in capsys.readouterr().out
    url = f"sqlite:///{tmp_path}/fresh.db"
    assert main(["outbox", "migrate", "--url", url]) == 0
    assert main(["outbox", "migrate", "--url", url]) == 0  # Idempotent.
    db = outboxes.open(url)
    assert db.has_outbox()


def test_the_entry_keeps_the_enqueuers_trace_context(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415

    sqlite_app_db(tmp_path / "app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("BEGIN")
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("request") as span:
        producer("http://127.0.0.1:9").enqueue("x", {}, key="k", transaction=conn)
        trace_id = f"{span.get_span_context().trace_id:032x}"
    conn.commit()
    (stored,) = conn.execute("SELECT trace_context FROM tasklease_outbox").fetchone()
    assert trace_id in json.loads(stored)["traceparent"]


# Postgres: psycopg, LISTEN/NOTIFY, SKIP LOCKED; SQLAlchemy on both.


def test_psycopg_commit_notifies_the_relay_and_the_task_is_created(
    pg_url: str, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    db, relay = outboxes.relay_for(pg_url, tasks)
    assert db.wait(0.01) is False  # LISTENing from now on.
    with pg_connect(pg_url) as conn:
        producer(tasks.url).enqueue("send_receipt", {}, key="pg-1", transaction=conn)
        assert db.wait(0.2) is False  # Not before the commit.
    assert db.wait(5) is True
    assert relay.drain().sent == 1
    assert task_names(tasks) == [task_id("send_receipt", "pg-1")]


def test_psycopg_autocommit_is_refused_but_its_explicit_transaction_is_used(pg_url: str) -> None:
    make = producer("http://127.0.0.1:9")
    with pg_connect(pg_url, autocommit=True) as conn:
        with pytest.raises(NotInTransaction, match="autocommit"):
            make.enqueue("x", {}, key="k", transaction=conn)
        with conn.transaction():
            assert make.enqueue("x", {}, key="k", transaction=conn).staged
        with conn.transaction():
            assert not make.enqueue("x", {}, key="k", transaction=conn).staged
        with pytest.raises(ValueError, match="rolled back"), conn.transaction():
            make.enqueue("x", {}, key="gone", transaction=conn)
            raise ValueError("rolled back")
        assert conn.execute("SELECT COUNT(*) FROM tasklease_outbox").fetchone() == (1,)


@pytest.mark.parametrize("kind", ["connection", "session"])
def test_sqlalchemy_connections_and_sessions_stage_inside_their_transaction(
    tmp_path: Path, tasks: CloudTasksEmulator, kind: str, outboxes: Outboxes
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    make = producer(tasks.url)
    if kind == "connection":
        with engine.connect() as conn:
            with pytest.raises(NotInTransaction):
                make.enqueue("x", {}, key="early", transaction=conn)
            with conn.begin():
                make.enqueue("x", {}, key="kept", transaction=conn)
            with pytest.raises(ValueError, match="rolled back"), conn.begin():
                make.enqueue("x", {}, key="gone", transaction=conn)
                raise ValueError("rolled back")
    else:
        with Session(engine) as session:
            with pytest.raises(NotInTransaction):
                make.enqueue("x", {}, key="early", transaction=session)
            with session.begin():
                make.enqueue("x", {}, key="kept", transaction=session)
            with pytest.raises(ValueError, match="rolled back"), session.begin():
                make.enqueue("x", {}, key="gone", transaction=session)
                raise ValueError("rolled back")
    engine.dispose()
    _db, relay = outboxes.relay_for(url, tasks)
    assert relay.drain().sent == 1
    assert task_names(tasks) == [task_id("x", "kept")]


def test_sqlalchemy_on_postgres_notifies_on_commit(
    pg_url: str, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    base, schema = pg_url.split("?schema=")
    engine = sqlalchemy.create_engine(
        base.replace("postgresql://", "postgresql+psycopg://"),
        connect_args={"options": f"-c search_path={schema}"},
    )
    db, relay = outboxes.relay_for(pg_url, tasks)
    db.wait(0.01)
    with engine.begin() as conn:
        producer(tasks.url).enqueue("x", {}, key="sa-pg", transaction=conn)
    engine.dispose()
    assert db.wait(5) is True
    assert relay.drain().sent == 1


def test_concurrent_postgres_relays_claim_disjoint_batches(
    pg_url: str, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    with pg_connect(pg_url) as conn:
        producer(tasks.url).enqueue_many(
            "record", [(f"k{n}", {}) for n in range(300)], transaction=conn
        )
    relays = [outboxes.relay_for(pg_url, tasks) for _ in range(3)]
    claimed = drain_at_once([relay for _, relay in relays], batch=50)
    assert sum(claimed) == 300  # No entry claimed twice, none left.
    assert len(task_names(tasks)) == 300


def test_the_sweeper_job_relays_every_due_entry_and_purges_old_sent_ones(
    tmp_path: Path, tasks: CloudTasksEmulator
) -> None:
    from tasklease.outbox import SWEEP_JOB, register  # noqa: PLC0415
    from tasklease.worker import Router  # noqa: PLC0415
    from tasklease.worker.core.identity import Kind  # noqa: PLC0415

    url = sqlite_app_db(tmp_path / "app.db")
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("BEGIN")
    producer(tasks.url).enqueue_many("record", [(f"k{n}", {}) for n in range(3)], transaction=conn)
    conn.commit()
    conn.execute("UPDATE tasklease_outbox SET state = 'sent', sent_at = 0 WHERE id LIKE '%k0'")
    conn.commit()
    router = Router()
    register(router, url=url, producer=relay_producer(relay_env(tasks.url)))
    spec = router.handler(Kind.SCHEDULER, SWEEP_JOB)
    assert spec is not None and spec.exclusive
    assert spec.function(None) == {"sent": 2, "failed": 0, "retrying": 0, "purged": 1}
    assert len(task_names(tasks)) == 2


def test_tasklease_dev_relays_the_outbox_of_its_store_or_of_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasklease.cli.dev_outbox import outbox_url  # noqa: PLC0415

    monkeypatch.delenv("TASKLEASE_OUTBOX_URL", raising=False)
    url = sqlite_app_db(tmp_path / "app.db")
    sqlite3.connect(tmp_path / "runs.db").close()
    assert outbox_url(url) == url
    assert outbox_url(f"sqlite:///{tmp_path}/runs.db") is None
    assert outbox_url("memory://") is None
    assert not (tmp_path / "absent.db").exists()
    assert outbox_url(f"sqlite:///{tmp_path}/absent.db") is None
    assert not (tmp_path / "absent.db").exists()  # The store creates it, with its own mode.
    monkeypatch.setenv("TASKLEASE_OUTBOX_URL", "sqlite:///elsewhere.db")
    assert outbox_url("memory://") == "sqlite:///elsewhere.db"


def test_a_sqlalchemy_session_commit_wakes_the_processs_relays_at_once(
    tmp_path: Path, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    db, relay = outboxes.relay_for(url, tasks)
    assert db.wait(0.01) is False  # Waiting from now on.
    with Session(engine) as session:
        with pytest.raises(ValueError, match="rolled back"), session.begin():
            producer(tasks.url).enqueue("x", {}, key="gone", transaction=session)
            raise ValueError("rolled back")
        assert db.wait(0.1) is False  # A rollback wakes nobody.
        with session.begin():
            producer(tasks.url).enqueue("x", {}, key="woken", transaction=session)
            assert db.wait(0.1) is False  # Not before the commit.
        assert db.wait(5) is True
    engine.dispose()
    assert relay.drain().sent == 1


def test_relay_and_status_say_what_to_do_when_there_is_no_outbox(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKLEASE_WORKER_URL", "http://127.0.0.1:9")
    missing = f"sqlite:///{tmp_path}/missing.db"
    assert main(["outbox", "status", "--url", missing]) == 2
    assert "no database file" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()
    sqlite3.connect(tmp_path / "empty.db").close()
    assert main(["outbox", "relay", "--url", f"sqlite:///{tmp_path}/empty.db"]) == 2
    assert "tasklease outbox migrate --url" in capsys.readouterr().err


def test_enqueue_by_reference_stages_through_the_transaction_too(tmp_path: Path) -> None:
    from tasklease.worker import Router  # noqa: PLC0415

    sqlite_app_db(tmp_path / "app.db")
    router = Router()

    @router.task("send_receipt")
    def send_receipt(payload: dict[str, int], ctx: Any) -> None: ...

    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("BEGIN")
    result = send_receipt.enqueue(
        {"order": 1}, key="o1", producer=producer("http://127.0.0.1:9"), transaction=conn
    )
    conn.commit()
    assert result.staged
    rows = conn.execute("SELECT task_name, task_id FROM tasklease_outbox").fetchall()
    assert rows == [("send_receipt", task_id("send_receipt", "o1"))]


def test_an_async_psycopg_connection_is_refused_by_name(pg_url: str) -> None:
    import asyncio  # noqa: PLC0415

    async def connect() -> Any:
        base = pg_url.split("?schema=", maxsplit=1)[0]
        return await psycopg.AsyncConnection.connect(base)

    async def refused() -> None:
        conn = await connect()
        try:
            with pytest.raises(TypeError, match=r"AsyncConnection.*not supported"):
                producer("http://127.0.0.1:9").enqueue("x", {}, key="k", transaction=conn)
        finally:
            await conn.close()

    asyncio.run(refused())
