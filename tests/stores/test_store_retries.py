"""The one retry of a store write made after the handler ran (finish, lock release)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tasklease.errors import StoreUnavailable
from tasklease.worker.stores.base import retries as store_retries
from tasklease.worker.stores.base.retries import retry_while_unavailable


def flaky(failures: int) -> tuple[list[int], Callable[[], bool]]:
    tries: list[int] = []

    def write() -> bool:
        tries.append(len(tries))
        if len(tries) <= failures:
            raise StoreUnavailable("down")
        return True

    return tries, write


def test_a_write_is_tried_again_after_each_pause_until_it_lands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store_retries, "FINISH_RETRY_PAUSES", (0.0, 0.0, 0.0))
    tries, write = flaky(3)
    assert retry_while_unavailable(write) is True
    assert len(tries) == 4


def test_the_last_tries_error_propagates_once_the_pauses_run_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store_retries, "FINISH_RETRY_PAUSES", (0.0, 0.0))
    tries, write = flaky(10)
    with pytest.raises(StoreUnavailable):
        retry_while_unavailable(write)
    assert len(tries) == 3


def test_any_other_error_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_retries, "FINISH_RETRY_PAUSES", (0.0,))
    tries: list[int] = []

    def write() -> bool:
        tries.append(1)
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        retry_while_unavailable(write)
    assert tries == [1]
