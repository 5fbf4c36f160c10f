"""Delivery counts from a real worker to the dashboard's deliveries chart: outcomes that leave
no run record (a duplicate, a 409) are counted in memory, written by the background flush and
drawn stacked by outcome; a failing store never fails a delivery and loses no count."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import flask
import pytest

from tasklease.errors import StoreUnavailable
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.activity import window_start
from tasklease.worker.core.deliveries import delivery_minutes
from tasklease.worker.dashboard import create_dashboard_app
from tasklease.worker.delivery.executor import Executor
from tasklease.worker.observe import tally_flusher
from tasklease.worker.observe.tally_flusher import DeliveryCounter
from tasklease.worker.stores import MemoryStore, SqliteStore
from tasklease.worker.stores.base.locks import LockStore
from tasklease.worker.stores.base.queries import OperatorQueries
from tasklease.worker.stores.base.tally import DeliveryTally, MinuteCounts, TallyKey, minute_of
from tests.support.helpers import task_headers


def counted(store: SqliteStore | MemoryStore) -> Counter[str]:
    """Every outcome counted in the store, summed over handlers and minutes."""
    total: Counter[str] = Counter()
    for keyed in store.delivery_counts(datetime(2000, 1, 1, tzinfo=UTC)).values():
        for key, n in keyed.items():
            total[key.outcome] += n
    return total


def worker(store: SqliteStore) -> tuple[flask.Flask, threading.Event, threading.Event]:
    router = Router()
    entered, release = threading.Event(), threading.Event()

    @router.task()
    def charge(payload: dict[str, Any], ctx: TaskContext) -> None:
        if payload.get("slow"):
            entered.set()
            release.wait(10)

    return create_app(router, store=store, auth="none"), entered, release


def post(app: flask.Flask, task: str, body: dict[str, Any]) -> int:
    response = app.test_client().post(
        "/tasks/charge", headers=task_headers(task=task), data=json.dumps(body)
    )
    return response.status_code


def test_a_workers_duplicates_and_409s_reach_the_dashboards_deliveries_chart(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    app, entered, release = worker(store)
    assert post(app, "t1", {}) == 200  # processed
    assert post(app, "t1", {}) == 200  # duplicate, answered from the record
    slow = threading.Thread(target=post, args=(app, "t2", {"slow": True}))
    slow.start()
    assert entered.wait(10)
    assert post(app, "t2", {"slow": True}) == 409  # in_progress: the first holds the lease
    release.set()
    slow.join(10)
    executor: Executor = app.extensions["tasklease"]
    assert executor.tally is not None
    assert counted(store) == Counter()  # Nothing written on the deliveries' own path.
    assert executor.tally.flush()
    assert counted(store) == Counter(processed=2, duplicate=1, in_progress=1)

    html = create_dashboard_app(store).test_client().get("/summary").text
    section = re.search(r'<section class="card wide" id="deliveries">.*?</section>', html, re.S)
    assert section is not None and 'id="not-in-store"' not in html
    for outcome in ("processed", "duplicate", "in_progress"):
        assert f'class="bar {outcome}"' in section.group(0)
    assert re.search(r"duplicate \(answered from the record\): <span class=\"count\">1<", html)
    assert re.search(r"in_progress \(409[^<]*: <span class=\"count\">1<", html)
    store.close()


def test_a_store_without_the_tally_keeps_the_note_instead_of_the_chart() -> None:
    # MemoryStore's methods on a class that does not claim the capability.
    methods = {k: v for k, v in vars(MemoryStore).items() if not k.startswith("_abc")}
    methods = {k: v for k, v in methods.items() if k in ("__init__", "__repr__") or k[:2] != "__"}
    store = type("Untallied", (LockStore, OperatorQueries), methods)()
    assert not isinstance(store, DeliveryTally)
    html = create_dashboard_app(store).test_client().get("/summary").text
    assert 'id="not-in-store"' in html and "keeps no delivery tally" in html
    assert 'id="deliveries"' not in html and 'class="chart deliveries"' not in html


class FlakyTally(MemoryStore):
    """Fails the first ``failures`` writes (after which it is a memory store)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.writes = 0

    def write_delivery_counts(self, instance: str, counts: MinuteCounts) -> None:
        self.writes += 1
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("down, for the test")
        super().write_delivery_counts(instance, counts)


def test_a_failed_flush_keeps_its_counts_and_the_next_writes_them_once() -> None:
    store = FlakyTally(failures=1)
    now = datetime(2026, 10, 16, 12, 0, 30, tzinfo=UTC)
    counter = DeliveryCounter(store, lambda: now, interval=3600)
    counter.count("task", "charge", "processed")
    counter.count("task", "charge", "duplicate")
    assert not counter.flush()
    counter.count("task", "charge", "processed")
    assert counter.flush()
    assert (counted(store), store.writes) == (Counter(processed=2, duplicate=1), 2)
    assert counter.flush()  # Nothing changed: no write.
    assert store.writes == 2
    counter.count("task", "charge", "processed")
    assert counter.flush()  # The grown minute, written as totals: never counted twice.
    assert counted(store) == Counter(processed=3, duplicate=1)
    key = TallyKey("task", "charge", "processed")
    assert store.delivery_counts(now)[minute_of(now)][key] == 3
    counter.close()


def test_each_count_lands_in_its_own_minute_across_boundaries_and_clocks_going_back() -> None:
    store = MemoryStore()
    moments = [
        datetime(2026, 10, 16, 12, minute, second, tzinfo=UTC)
        for minute, second in ((0, 59), (1, 0), (1, 30), (0, 10), (2, 0))
    ]

    def clock() -> datetime:  # Each reading the next moment; the last one stays.
        return moments.pop(0) if len(moments) > 1 else moments[0]

    counter = DeliveryCounter(store, clock, interval=3600)
    for _ in range(5):
        counter.count("task", "charge", "processed")
    assert counter.flush()
    key = TallyKey("task", "charge", "processed")
    since = datetime(2026, 10, 16, 12, 0, tzinfo=UTC)
    per_minute = {
        minute.minute: counts[key] for minute, counts in store.delivery_counts(since).items()
    }
    assert per_minute == {0: 2, 1: 2, 2: 1}
    counter.close()


def test_the_background_thread_writes_the_counts_without_being_asked() -> None:
    store = MemoryStore()
    counter = DeliveryCounter(store, lambda: datetime.now(UTC), interval=0.02)
    counter.count("task", "charge", "processed")
    deadline = time.monotonic() + 10
    while not counted(store) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert counted(store) == Counter(processed=1)
    counter.close()


@pytest.mark.parametrize("outcome", ["lost_claim", "key_busy"])
def test_outcomes_outside_the_six_are_drawn_as_other_and_the_six_as_themselves(
    outcome: str,
) -> None:
    now = datetime.now(UTC)
    rows = [(minute_of(now), "charge", outcome, 3)]
    minutes = delivery_minutes(rows, window_start(now))
    expected = outcome if outcome == "lost_claim" else "other"
    assert minutes.columns[-1] == Counter({expected: 3})


class BlockedTally(MemoryStore):
    """A store whose writes hang until the test lets them go (a store that is down)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.go = threading.Event(), threading.Event()

    def write_delivery_counts(self, instance: str, counts: MinuteCounts) -> None:
        self.entered.set()
        self.go.wait(10)
        super().write_delivery_counts(instance, counts)


def test_the_exit_flush_gives_up_on_a_hanging_store_instead_of_holding_up_the_exit() -> None:
    store = BlockedTally()
    counter = DeliveryCounter(store, lambda: datetime.now(UTC), interval=3600)
    counter.count("task", "charge", "processed")
    flusher = tally_flusher._Flusher()  # Of this counter only: atexit runs the process's.
    flusher.watch(counter)
    flusher.close_all(timeout=0.05)
    assert store.entered.is_set() and counted(store) == Counter()  # Returned mid-write.
    store.go.set()
