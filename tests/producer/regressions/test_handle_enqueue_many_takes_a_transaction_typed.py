"""Finding: a handle's ``enqueue_many`` and ``fan_out`` staged through ``transaction=`` at run
time (the keyword reached the producer through ``**options``), but their signatures did not
name it, so ``mypy --strict`` rejected the documented call (``Unexpected keyword argument
"transaction"``) that ``enqueue`` and the producer's own methods accept."""

from __future__ import annotations

from tests.worker.test_handler_typing import cache, mypy

__all__ = ["cache"]  # The fixture, shared with the handler typing tests.


def test_every_enqueue_of_a_handle_takes_a_transaction_under_mypy_strict(cache: str) -> None:
    assert mypy("tests/typing/outbox_handles_ok.py", cache) == []
