"""The outbox in Spanner: entries staged through a ``Transaction`` inside
``run_in_transaction``, relayed once after commit (against Google's Spanner emulator,
tests/support/spanner.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import NotInTransaction, Relay, open_outbox, relay_producer, wake
from tasklease.outbox.entries import Entry
from tasklease.outbox.locate import outbox_url
from tasklease.outbox.spanner_db import SpannerOutbox
from tasklease.producer import EnqueueResult, task_id
from tasklease.testing.contract_support import T0, claim_request
from tasklease.worker.dashboard import create_dashboard_app
from tasklease.worker.stores import SpannerStore
from tests.support.outbox import Outboxes, drain_at_once, producer, relay_env, task_names
from tests.support.outbox import spanner_database as app_database
from tests.support.spanner import RpcCounter

ORDERS = "CREATE TABLE orders (id STRING(64) NOT NULL, total INT64) PRIMARY KEY (id)"


@pytest.fixture
def url(spanner_database: str) -> str:
    """The outbox URL of a fresh database with the outbox and an ``orders`` table."""
    url = f"spanner://{spanner_database}"
    db = open_outbox(url)
    db.migrate()
    db.close()
    app_database(url).update_ddl([ORDERS]).result(60)
    return url


@pytest.fixture
def app_db(url: str) -> Any:
    """The caller's own ``spanner.Database``."""
    return app_database(url)


def place_order(
    app_db: Any, endpoint: str, order: int, *, fail: bool = False, queue: str = ""
) -> EnqueueResult:
    """A request handler: the order row and its receipt task in one transaction."""

    def checkout(tx: Any) -> EnqueueResult:
        tx.insert("orders", ("id", "total"), [[str(order), 990]])
        result = producer(endpoint).enqueue(
            "send_receipt",
            {"order": order},
            key=f"o{order}",
            transaction=tx,
            queue=queue or None,
        )
        if fail:
            raise RuntimeError("payment declined")  # After the enqueue: all of it rolls back.
        return result

    result: EnqueueResult = app_db.run_in_transaction(checkout)
    return result


def rows(app_db: Any, table: str) -> int:
    with app_db.snapshot() as snapshot:
        return int(next(iter(snapshot.execute_sql(f"SELECT COUNT(*) FROM {table}")))[0])


def test_a_committed_transaction_stages_the_entry_and_the_relay_creates_its_task_once(
    url: str, app_db: Any, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    result = place_order(app_db, tasks.url, 42)
    assert result.staged and not result.created
    assert task_names(tasks) == []  # Nothing sent before the relay, even after the commit.
    db, relay = outboxes.relay_for(url, tasks, SpannerOutbox)
    assert relay.drain().sent == 1
    assert task_names(tasks) == [task_id("send_receipt", "o42")]
    assert relay.drain().claimed == 0  # Marked sent: never sent again.
    status = db.status(0)
    assert (status.depth, status.sent, status.failed_total) == (0, 1, 0)


def test_the_staged_body_and_headers_come_back_unchanged(
    url: str, app_db: Any, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    body = {"order": 1, "note": "abcd"}

    def checkout(tx: Any) -> EnqueueResult:
        return producer(tasks.url).enqueue("x", body, key="b", transaction=tx)

    staged = app_db.run_in_transaction(checkout)
    db, _relay = outboxes.relay_for(url, tasks, SpannerOutbox)
    [entry] = db.claim(10, 10**10, 60)
    assert isinstance(entry, Entry)
    assert entry.id == staged.name
    assert b'"note":"abcd"' in entry.request.body.replace(b" ", b"")
    assert json.loads(entry.request.body)
    assert entry.request.headers["Content-Type"].startswith("application/json")


def test_rolled_back_transactions_leave_no_entry_and_create_no_task(
    url: str, app_db: Any, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    for order in range(10):
        with pytest.raises(RuntimeError, match="payment declined"):
            place_order(app_db, tasks.url, order, fail=True)
    assert rows(app_db, "tasklease_outbox") == 0
    assert rows(app_db, "orders") == 0
    _db, relay = outboxes.relay_for(url, tasks, SpannerOutbox)
    assert relay.drain().claimed == 0
    assert task_names(tasks) == []


def test_a_finished_transaction_or_a_batch_is_refused(app_db: Any) -> None:
    make = producer("http://127.0.0.1:9")
    kept: list[Any] = []

    def keep(tx: Any) -> None:
        list(tx.execute_sql("SELECT 1"))  # Begins the transaction, so that it commits.
        kept.append(tx)

    app_db.run_in_transaction(keep)
    with pytest.raises(NotInTransaction, match="committed or rolled back"):
        make.enqueue("x", {}, key="k", transaction=kept[0])
    with app_db.batch() as batch, pytest.raises(TypeError, match="spanner_v1 Transaction"):
        make.enqueue("x", {}, key="k", transaction=batch)
    assert rows(app_db, "tasklease_outbox") == 0


def test_a_key_staged_again_keeps_one_entry_within_and_across_transactions(
    url: str, app_db: Any, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    make = producer(tasks.url)

    def twice(tx: Any) -> list[bool]:
        return [make.enqueue("x", {}, key="same", transaction=tx).staged for _ in range(2)]

    assert app_db.run_in_transaction(twice) == [True, False]
    assert app_db.run_in_transaction(twice) == [False, False]  # Committed before: name taken.
    assert rows(app_db, "tasklease_outbox") == 1
    _db, relay = outboxes.relay_for(url, tasks, SpannerOutbox)
    assert relay.drain().sent == 1
    assert task_names(tasks) == [task_id("x", "same")]


def test_racing_relays_claim_disjoint_batches_and_create_each_task_once(
    url: str, app_db: Any, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    def stage(tx: Any) -> None:
        producer(tasks.url).enqueue_many(
            "record", [(f"k{n}", {}) for n in range(120)], transaction=tx
        )

    app_db.run_in_transaction(stage)
    relays = [outboxes.relay_for(url, tasks, SpannerOutbox) for _ in range(3)]
    claimed = drain_at_once([relay for _, relay in relays], batch=20)
    assert sum(claimed) == 120  # No entry claimed twice, none left.
    assert len(task_names(tasks)) == 120
    assert relays[0][0].status(0).sent == 120


def test_a_poison_entry_fails_with_its_reason_never_blocks_others_and_can_be_requeued(
    url: str, app_db: Any, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    place_order(app_db, tasks.url, 1)
    place_order(app_db, tasks.url, 2, queue="no-such-queue")
    place_order(app_db, tasks.url, 3)
    db, relay = outboxes.relay_for(url, tasks, SpannerOutbox)
    done = relay.drain()
    assert (done.sent, done.failed) == (2, 1)
    status = db.status(0)
    assert status.failed_total == 1 and "no-such-queue" in status.failed[0].reason
    assert db.requeue_failed() == 1
    assert db.status(0).depth == 1
    assert db.purge_sent(before=10**10) == 2  # The sent entries; the requeued one stays.
    assert db.status(0).sent == 0


def test_cloud_tasks_down_backs_entries_off_and_marks_none_sent(
    url: str, app_db: Any, outboxes: Outboxes
) -> None:
    place_order(app_db, "http://127.0.0.1:9", 5)
    db = outboxes.open(url)
    relay = Relay(db, relay_producer(relay_env("http://127.0.0.1:9")))
    done = relay.run_once()
    assert (done.claimed, done.sent, done.retrying) == (1, 0, 1)
    status = db.status(0)
    assert (status.depth, status.sent, status.retrying) == (1, 0, 1)
    assert relay.run_once().claimed == 0  # Backed off: not due yet.


def test_a_commit_wakes_the_relays_of_its_process_at_once(
    url: str, app_db: Any, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    db, relay = outboxes.relay_for(url, tasks, SpannerOutbox)
    assert db.wait(0.05) is False  # Nothing committed: no wake-up.
    hold = wake.waiter()
    try:

        def checkout(tx: Any) -> None:
            producer(tasks.url).enqueue("x", {}, key="w", transaction=tx)
            assert not hold.is_set()  # Not before the commit.

        app_db.run_in_transaction(checkout)
        assert hold.is_set()  # Set when the commit returned, not by a poll.
    finally:
        wake.forget(hold)
    assert db.wait(0) is True
    assert relay.drain().sent == 1


def test_the_cli_migrates_prints_relays_and_reports_a_spanner_outbox(
    spanner_database: str, tasks: CloudTasksEmulator
) -> None:
    url = f"spanner://{spanner_database}"
    env = relay_env(tasks.url)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tasklease.cli", "outbox", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, **env},
        )

    printed = cli("migrate", "--print", "spanner")
    assert printed.returncode == 0 and "ROW DELETION POLICY" in printed.stdout
    assert cli("status", "--url", url).returncode == 2  # No table yet: says to migrate.
    assert outbox_url(url + "?table=tasklease_runs") is None
    assert cli("migrate", "--url", url).returncode == 0
    assert outbox_url(url + "?table=tasklease_runs") == url  # tasklease dev, the dashboard.
    app_database(url).run_in_transaction(
        lambda tx: producer(tasks.url).enqueue("send_receipt", {}, key="o9", transaction=tx)
    )
    status = cli("status", "--url", url)
    assert status.returncode == 0 and status.stdout.startswith("pending 1 ")
    relayed = cli("relay", "--url", url)
    assert relayed.returncode == 0 and "sent 1," in relayed.stdout, relayed.stderr
    assert task_names(tasks) == [task_id("send_receipt", "o9")]


def test_a_transactional_handler_on_the_spanner_store_stages_with_its_completion(
    url: str, tasks: CloudTasksEmulator, outboxes: Outboxes
) -> None:
    """``ctx.transaction`` of a ``transactional=True`` handler on the Spanner store is the
    Spanner ``Transaction``: the entry commits with the run's record, or not at all."""
    store = SpannerStore(url[len("spanner://") :])
    make = producer(tasks.url)

    def work(key: str, fail: bool = False) -> Any:
        def run(tx: Any) -> str:
            make.enqueue("next_step", {}, key=key, transaction=tx)
            if fail:
                raise ValueError("the handler failed")
            return "{}"

        return run

    try:
        store.claim(claim_request(), T0)
        with pytest.raises(ValueError, match="the handler failed"):
            store.complete_in_transaction("run-1", "attempt-1", work("bad", fail=True), T0)
        assert db_rows(url) == 0  # The handler raised: its entry rolled back with it.
        assert store.complete_in_transaction("run-1", "attempt-1", work("good"), T0).held
    finally:
        store.close()
    _db, relay = outboxes.relay_for(url, tasks, SpannerOutbox)
    assert relay.drain().sent == 1
    assert task_names(tasks) == [task_id("next_step", "good")]


def db_rows(url: str) -> int:
    return rows(app_database(url), "tasklease_outbox")


def test_the_dashboard_of_a_spanner_store_shows_its_databases_outbox(
    url: str,
    app_db: Any,
    tasks: CloudTasksEmulator,
    outboxes: Outboxes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TASKLEASE_OUTBOX_URL", raising=False)
    place_order(app_db, tasks.url, 1)
    place_order(app_db, tasks.url, 2, queue="no-such-queue")
    _db, relay = outboxes.relay_for(url, tasks, SpannerOutbox)
    assert relay.drain().failed == 1
    place_order(app_db, tasks.url, 3)
    store = SpannerStore(url[len("spanner://") :])
    try:
        page = create_dashboard_app(store).test_client().get("/outbox")
    finally:
        store.close()
    assert page.status_code == 200, page.text
    assert re.search(r'id="depth">1<', page.text)
    assert re.search(r'id="failed-total">1<', page.text)
    assert "no-such-queue" in page.text


def test_an_enqueue_costs_the_callers_transaction_one_read_at_most(
    url: str, app_db: Any, tasks: CloudTasksEmulator
) -> None:
    """The caller's cost in RPCs (what carries over from the emulator to Spanner): the read
    of the entry's key, its insert riding in the caller's own Commit. A transaction of
    mutations only pays nothing more (the read begins it, in place of BeginTransaction).
    Printed for BENCHMARKS.md."""
    make = producer(tasks.url)
    place_order(app_db, tasks.url, 0)  # Warm: the session and the channel exist.
    rpcs = RpcCounter(app_db)

    def order(tx: Any, n: int, enqueue: bool, reads: bool) -> None:
        if reads:
            list(tx.execute_sql("SELECT COUNT(*) FROM orders"))
        tx.insert("orders", ("id", "total"), [[str(n), 990]])
        if enqueue:
            make.enqueue("send_receipt", {}, key=f"o{n}", transaction=tx)

    counts = {}
    for n, (enqueue, reads) in enumerate(
        [(False, False), (True, False), (False, True), (True, True)], start=1
    ):
        app_db.run_in_transaction(order, n, enqueue, reads)
        counts[enqueue, reads] = rpcs.take()
    print(f"spanner order transaction RPCs (enqueue, reads first): {counts}")
    assert counts[True, False] == ["streaming_read", "commit"]
    assert len(counts[True, False]) == len(counts[False, False])
    assert counts[True, True] == [*counts[False, True][:-1], "streaming_read", "commit"]
