"""bench.asgi_throughput's choices of configuration: a name it does not know stops the run
with the names it does, before any server starts."""

from __future__ import annotations

import pytest

from bench.asgi_throughput import STORES, choices


def test_the_stores_it_knows_are_taken_in_the_order_given() -> None:
    assert choices("postgres, sqlite", STORES, "--stores") == ["postgres", "sqlite"]


@pytest.mark.parametrize("text", ["oracle", "sqlite,oracle", ","])
def test_an_unknown_or_empty_choice_names_the_ones_it_takes(text: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        choices(text, STORES, "--stores")
    assert str(stopped.value) == (
        f"--stores {text!r}: a comma-separated list of sqlite, postgres, memory"
    )
