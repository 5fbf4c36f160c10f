"""The demo's checkout: each order and its tasks commit together through the outbox."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tasklease.demo.orders import Checkout
from tasklease.outbox.entries import TABLE
from tasklease.producer import Producer


def _producer() -> Producer:
    # Staging sends nothing: the endpoint is never called.
    return Producer(
        "p", "us-central1", "q", "http://127.0.0.1:9", tasks_endpoint="http://127.0.0.1:9"
    )


def test_committed_checkouts_stage_three_tasks_each_and_abandoned_ones_nothing(
    tmp_path: Path,
) -> None:
    checkout = Checkout(tmp_path / "shop.db")
    checkout.create()
    checkout.place(_producer(), range(1, 21), abandoned_from=21)
    with sqlite3.connect(checkout.path) as conn:
        orders = {row[0] for row in conn.execute("SELECT id FROM orders")}
        staged = {row[0] for row in conn.execute(f"SELECT id FROM {TABLE}")}
    assert orders == set(range(1, 21))  # The two abandoned orders (21, 22) rolled back.
    assert len(checkout.rolled_back) == 2
    assert len(staged) == 3 * 20
    assert not staged & {r.name for r in checkout.rolled_back}
    # Every third order was submitted twice: the second submission staged nothing new.
    assert sum(not r.staged for r in checkout.committed) == 6


def test_the_tally_adds_up_only_when_every_committed_receipt_was_created(
    tmp_path: Path,
) -> None:
    checkout = Checkout(tmp_path / "shop.db")
    checkout.create()
    checkout.place(_producer(), range(1, 11), abandoned_from=11)
    receipts = {r.name for r in checkout.committed}
    with sqlite3.connect(checkout.path) as conn:
        conn.execute(f"UPDATE {TABLE} SET state = 'sent'")
    tally = checkout.tally(receipts, set(range(1, 11)))
    assert tally.describe() == (
        "orders committed 10, receipts created 10, rolled-back orders 1, receipts for them 0"
    )
    assert tally.adds_up(10)
    # A receipt run for the rolled-back order would be a receipt for an order that is not.
    assert not checkout.tally(receipts, set(range(1, 12))).adds_up(10)
    assert not checkout.tally(set(list(receipts)[1:]), set(range(1, 11))).adds_up(10)
