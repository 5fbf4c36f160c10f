"""The demo's checkout: orders placed as a web app places them, through the outbox.

Each checkout is one SQLite transaction in the shop's own database (not the lease store's):
the order row and its three tasks (receipt, charge, ledger posting) are written together, the
tasks as outbox entries (``transaction=conn``), so they exist exactly when the order does. A
double-submitted checkout runs again and stages nothing new (the entries' names are taken).
Some checkouts are abandoned after the enqueue and rolled back: neither the order nor its
tasks exist. A relay (:class:`tasklease.outbox.RelayThread`) creates the committed tasks
through the emulator after each commit.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tasklease.outbox import open_outbox
from tasklease.outbox.entries import FAILED, PENDING, SENT, TABLE
from tasklease.producer import EnqueueResult, Producer

ACCOUNTS = 10
ABANDON_EVERY = 10  # One abandoned (rolled-back) checkout per this many committed orders.


@dataclass
class Checkout:
    """The shop's database and what was placed in it."""

    path: Path
    committed: list[EnqueueResult] = field(default_factory=list)  # Receipts, one per staging.
    rolled_back: list[EnqueueResult] = field(default_factory=list)  # Receipts never committed.

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"

    def create(self) -> None:
        """The orders table and the outbox table (``tasklease outbox migrate``)."""
        with sqlite3.connect(self.path) as conn:
            conn.execute("PRAGMA journal_mode = WAL")  # The relay reads while orders commit.
            conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, account TEXT)")
        outbox = open_outbox(self.url)
        try:
            outbox.migrate()
        finally:
            outbox.close()

    def place(self, producer: Producer, orders: Iterable[int], abandoned_from: int) -> None:
        """Check out each order (every third twice); abandon one in ``ABANDON_EVERY``, with
        ids from ``abandoned_from`` on, rolled back after its enqueue."""
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            abandoned = abandoned_from
            for order in orders:
                for _ in range(2 if order % 3 == 0 else 1):
                    self.committed.append(self._checkout(conn, producer, order, commit=True))
                if order % ABANDON_EVERY == 0:
                    self.rolled_back.append(self._checkout(conn, producer, abandoned, commit=False))
                    abandoned += 1
        finally:
            conn.close()

    @staticmethod
    def _checkout(
        conn: sqlite3.Connection, producer: Producer, order: int, *, commit: bool
    ) -> EnqueueResult:
        """One request handler: the order row and its tasks in one transaction."""
        account = f"account-{order % ACCOUNTS}"  # Few: postings contend.
        # sqlite3 opens the transaction before this INSERT; the enqueues write into it.
        conn.execute("INSERT OR IGNORE INTO orders (id, account) VALUES (?, ?)", (order, account))
        receipt = producer.enqueue(
            "send_receipt", {"order_id": order}, key=f"order-{order}", transaction=conn
        )
        producer.enqueue(
            "charge_order", {"order_id": order}, key=f"charge-{order}", transaction=conn
        )
        producer.enqueue(
            "post_ledger",
            {"order_id": order, "account_id": account},
            key=f"posting-{order}",
            transaction=conn,
        )
        if commit:
            conn.commit()
        else:
            conn.rollback()  # The customer walked away: the order and its tasks are gone.
        return receipt

    def wait_relayed(self, timeout: float = 60.0) -> None:
        """Until the relay has handled every committed entry (sent or failed)."""
        outbox = open_outbox(self.url)
        try:
            deadline = time.monotonic() + timeout
            while outbox.pending(time.time())[0] and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            outbox.close()

    def tally(self, created: set[str], receipts_run: set[int]) -> OrderTally:
        """Count against the tasks the emulator created (``created``: task names) and the
        orders whose receipt handler ran (``receipts_run``)."""
        with sqlite3.connect(self.path) as conn:
            orders = {row[0] for row in conn.execute("SELECT id FROM orders")}
            states = dict(
                conn.execute(f"SELECT state, COUNT(*) FROM {TABLE} GROUP BY state").fetchall()
            )
        abandoned = {_order_of(r) for r in self.rolled_back}
        return OrderTally(
            committed=len(orders),
            receipts_created=len({r.name for r in self.committed} & created),
            rolled_back=len(self.rolled_back),
            rolled_back_receipts=len({r.name for r in self.rolled_back} & created)
            + len(abandoned & receipts_run),
            orders_of_rolled_back=len(abandoned & orders),
            duplicates_absorbed=sum(not r.staged for r in self.committed),
            sent=int(states.get(SENT, 0)),
            waiting=int(states.get(PENDING, 0)) + int(states.get(FAILED, 0)),
        )


def _order_of(result: EnqueueResult) -> int:
    assert result.key is not None
    return int(result.key.removeprefix("order-"))


@dataclass(frozen=True)
class OrderTally:
    """The checkout's end state: what committed, what the relay created, what rolled back."""

    committed: int
    receipts_created: int
    rolled_back: int
    rolled_back_receipts: int  # Receipt tasks created or run for rolled-back orders.
    orders_of_rolled_back: int  # Rolled-back orders found in the orders table.
    duplicates_absorbed: int  # Double-submitted checkouts that staged nothing new.
    sent: int  # Outbox entries the relay marked sent.
    waiting: int  # Outbox entries still pending, or failed.

    def adds_up(self, orders: int) -> bool:
        return (
            self.committed == self.receipts_created == orders
            and self.rolled_back_receipts == self.orders_of_rolled_back == 0
            and self.sent == 3 * orders
            and self.waiting == 0
        )

    def describe(self) -> str:
        return (
            f"orders committed {self.committed}, receipts created {self.receipts_created}, "
            f"rolled-back orders {self.rolled_back}, receipts for them {self.rolled_back_receipts}"
        )
