"""A shop's last hour in a store, for the dashboard's pictures: steady receipts, card charges
with a dead letter and its replay, a run retried twice, a crashed attempt, a long task name."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from tasklease.worker.core.decisions import replay_pending
from tasklease.worker.stores.base.queries import OperatorQueries
from tasklease.worker.stores.base.store import LeaseStore
from tasklease.worker.stores.base.tally import DeliveryTally, TallyKey, minute_of
from tests.support.helpers import claim_request

LONG_TASK = "export_" + "quarterly_ledger_" * 8 + "2026Q3"  # No break opportunity.
LONG_HANDLER = "reconcile_settlements_against_the_acquirer_daily_report_" + "x" * 30
RETRIED = "send_receipt-order-2001"
TAKEN_OVER = "sync_inventory-sku-91"
REPLAYED = "charge_card-order-1044"


def task(store: LeaseStore, handler: str, name: str, at: datetime, attempt: str = "a1") -> str:
    run_id = f"{handler}-{name}"
    identity = {"queue": "default", "task_name": name}
    store.claim(claim_request(run_id, attempt, handler=handler, identity=identity), at)
    return run_id


def seed_hour(store: OperatorQueries, now: datetime) -> None:
    """About 300 runs over the last hour, busier towards now, and the stories above."""
    rng = random.Random(7)
    for minute in range(60, 0, -1):
        busy = 2 + (60 - minute) // 12
        for n in range(rng.randint(busy, busy + 3)):
            handler = rng.choice(["send_receipt", "send_receipt", "charge_card", "sync_inventory"])
            at = now - timedelta(minutes=minute, seconds=-rng.uniform(0, 59))
            run_id = task(store, handler, f"m{minute}-{n}", at)
            took = timedelta(seconds=rng.lognormvariate(-1.5, 0.8))
            roll = rng.random()
            if roll < 0.9 or minute < 2:
                store.complete(run_id, "a1", '{"ok":true}', at + took)
            elif roll < 0.95:
                store.fail(run_id, "a1", "PermanentFailure: card declined", at + took, "{}")
            else:
                store.release(run_id, "a1", "TimeoutError: upstream 503", at + took)
    # A run released twice, then completed by its third attempt.
    start = now - timedelta(minutes=20)
    task(store, "send_receipt", "order-2001", start)
    store.release(RETRIED, "a1", "TimeoutError: SMTP 421", start + timedelta(seconds=3))
    task(store, "send_receipt", "order-2001", start + timedelta(seconds=13), "a2")
    store.release(RETRIED, "a2", "TimeoutError: SMTP 421", start + timedelta(seconds=16))
    task(store, "send_receipt", "order-2001", start + timedelta(seconds=46), "a3")
    store.complete(RETRIED, "a3", '{"sent":true}', start + timedelta(seconds=48))
    # A dead letter and its replay, which completed.
    failed_at = now - timedelta(minutes=35)
    task(store, "charge_card", "order-1044", failed_at)
    error = "PermanentFailure: card declined (2051)"
    store.fail(REPLAYED, "a1", error, failed_at + timedelta(seconds=1), '{"order":1044}')
    record = store.get(REPLAYED)
    assert record is not None
    identity = {"queue": "default", "task_name": "charge_card-replay-1044"}
    replay_at = now - timedelta(minutes=12)
    pending = replay_pending(record, "charge_card-replay-1044", identity, replay_at)
    store.add_replay(pending)
    store.mark_replayed(REPLAYED, pending.run_id)
    request = claim_request(pending.run_id, "r1", handler="charge_card", identity=identity)
    store.claim(request, replay_at + timedelta(seconds=2))
    store.complete(pending.run_id, "r1", '{"charged":true}', replay_at + timedelta(seconds=3))
    # A crashed attempt, its lease long lapsed; a long-named run.
    task(store, "sync_inventory", "sku-88", now - timedelta(minutes=40))
    # A takeover: the first attempt's worker died, the retry took the run over and runs now.
    task(store, "sync_inventory", "sku-91", now - timedelta(minutes=8))
    task(store, "sync_inventory", "sku-91", now - timedelta(seconds=40), "a2-takeover")
    long_run = task(store, LONG_HANDLER, LONG_TASK, now - timedelta(minutes=5))
    store.complete(long_run, "a1", None, now - timedelta(minutes=5) + timedelta(seconds=9))


def seed_deliveries(store: DeliveryTally, now: datetime) -> None:
    """An hour of two worker processes' delivery counts: mostly processed, with duplicates,
    409s, releases and the odd lost claim, for three of the handlers above."""
    rng = random.Random(11)
    for instance in ("rev-1/host-a:7", "rev-1/host-b:9"):
        counts: dict[datetime, dict[TallyKey, int]] = {}
        for minute in range(59, -1, -1):
            at = minute_of(now - timedelta(minutes=minute))
            busy = 2 + (60 - minute) // 10
            keyed = counts.setdefault(at, {})
            for handler in ("send_receipt", "charge_card", "sync_inventory"):
                for outcome, weight in OUTCOME_WEIGHTS:
                    n = sum(1 for _ in range(busy) if rng.random() < weight)
                    if n:
                        keyed[TallyKey("task", handler, outcome)] = n
        store.write_delivery_counts(instance, counts)


OUTCOME_WEIGHTS = (
    ("processed", 0.8),
    ("duplicate", 0.25),
    ("in_progress", 0.15),
    ("released", 0.08),
    ("lost_claim", 0.02),
)
