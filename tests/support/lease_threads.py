"""Shared by the lease keeper's regressions: a store that counts renewals, and the keeper's
threads refused once, as a process out of threads or memory refuses them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from tasklease.worker.delivery import lease as lease_module
from tasklease.worker.stores.memory.store import MemoryStore


class CountingStore(MemoryStore):
    """A memory store that counts the renewals asked of it."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals = 0

    def renew_run(self, *args: Any, **kwargs: Any) -> Any:
        self.renewals += 1
        return super().renew_run(*args, **kwargs)


def refuse_one_thread_start(
    monkeypatch: pytest.MonkeyPatch, named: Callable[[str], bool]
) -> threading.Event:
    """The lease keeper's first start of a thread whose name is ``named`` raises
    ``RuntimeError("can't start new thread")``; the event is set once it has."""
    refused = threading.Event()

    class RefusedOnce(threading.Thread):
        def start(self) -> None:
            if named(self.name) and not refused.is_set():
                refused.set()
                raise RuntimeError("can't start new thread")
            super().start()

    monkeypatch.setattr(
        lease_module,
        "threading",
        SimpleNamespace(Thread=RefusedOnce, Condition=threading.Condition),
    )
    return refused
