"""The shop's money: each order moves its amount from the customers' wallets to the shop's
till, in the lease store's own SQLite database, inside the run's transaction
(``transactional=True``). A duplicate or a retried delivery cannot move it twice, and a
crash between the move and the run's record cannot either: both commit, or neither does.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

WALLETS, TILL = "customer_wallets", "shop_till"
OPENING = 1_000_000  # Cents in the customers' wallets at the start; the till starts at 0.

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS shop_accounts (name TEXT PRIMARY KEY, balance INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS shop_transfers (order_id INTEGER NOT NULL, amount INTEGER "
    "NOT NULL, run_id TEXT NOT NULL)",  # No key: a second move would show as a second row.
)


def amount_of(order_id: int) -> int:
    """An order's amount in cents."""
    return 100 * (order_id % 7 + 1)


def move(tx: sqlite3.Connection, order_id: int, run_id: str) -> int:
    """Move the order's amount from the wallets to the till, in ``tx``; return it."""
    for statement in _SCHEMA:
        tx.execute(statement)
    tx.execute(
        "INSERT OR IGNORE INTO shop_accounts VALUES (?, ?), (?, 0)", (WALLETS, OPENING, TILL)
    )
    amount = amount_of(order_id)
    tx.execute("UPDATE shop_accounts SET balance = balance - ? WHERE name = ?", (amount, WALLETS))
    tx.execute("UPDATE shop_accounts SET balance = balance + ? WHERE name = ?", (amount, TILL))
    tx.execute("INSERT INTO shop_transfers VALUES (?, ?, ?)", (order_id, amount, run_id))
    return amount


@dataclass(frozen=True)
class Books:
    """What the database holds after the demo."""

    wallets: int
    till: int
    moves_per_order: dict[int, int]

    @classmethod
    def read(cls, database: Path) -> Books:
        if not database.exists():
            return cls(OPENING, 0, {})
        connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in connection.execute("SELECT name FROM sqlite_master")}
            if "shop_accounts" not in tables:
                return cls(OPENING, 0, {})
            balances = dict(connection.execute("SELECT name, balance FROM shop_accounts"))
            moves = dict(
                connection.execute("SELECT order_id, count(*) FROM shop_transfers GROUP BY 1")
            )
        finally:
            connection.close()
        return cls(balances.get(WALLETS, OPENING), balances.get(TILL, 0), moves)

    def adds_up(self, orders: int) -> bool:
        """Every order moved once, the till holds their sum, and no money appeared or vanished."""
        expected = sum(amount_of(order) for order in range(1, orders + 1))
        return (
            self.moves_per_order == dict.fromkeys(range(1, orders + 1), 1)
            and self.till == expected
            and self.wallets + self.till == OPENING
        )

    def describe(self) -> str:
        return (
            f"wallets {self.wallets} + till {self.till} = {self.wallets + self.till} "
            f"(opening {OPENING})"
        )
