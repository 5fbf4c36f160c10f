"""The demo's books: the check that its transactional charges add up catches a double move."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tasklease.demo.transfers import OPENING, Books, amount_of, move


def test_books_add_up_after_one_move_per_order_and_not_after_a_second(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    connection = sqlite3.connect(database, isolation_level=None)
    for order in (1, 2):
        move(connection, order, f"run-{order}")
    books = Books.read(database)
    assert books.adds_up(2)
    assert books.till == amount_of(1) + amount_of(2)
    assert books.wallets + books.till == OPENING
    move(connection, 2, "run-2")  # What a non-transactional retry after a crash would do.
    assert not Books.read(database).adds_up(2)
    connection.close()


def test_books_of_a_database_without_charges_are_the_opening_balances(tmp_path: Path) -> None:
    assert Books.read(tmp_path / "absent.db") == Books(OPENING, 0, {})
    assert not Books.read(tmp_path / "absent.db").adds_up(1)
