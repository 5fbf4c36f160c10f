"""Finding: the lease keeper's one scheduler thread starts a thread per renewal and has no
error handling; when one ``Thread.start()`` fails (RuntimeError "can't start new thread"
under thread or memory exhaustion), the scheduler thread dies, and with the same pid it is
never restarted: no lease in the process is renewed again, every running handler's lease
lapses and is taken over while it still runs."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from tasklease.worker.delivery import lease as lease_module
from tasklease.worker.delivery.lease import LeaseKeeper
from tasklease.worker.handlers.attempt import Attempt
from tasklease.worker.stores.memory.store import MemoryStore
from tests.support.helpers import claim_request

# Renewed every 2 s. The retried renewal must come before the lease lapses by the local clock
# (then no renewal is tried at all): on a loaded machine a 1.5 s lease was too short for that.
LEASE = timedelta(seconds=6)


class FlakyThread(threading.Thread):
    """Refuses to start the first renewal thread, as an exhausted process does."""

    refused = threading.Event()

    def start(self) -> None:
        if self.name.startswith("tasklease-renew") and not FlakyThread.refused.is_set():
            FlakyThread.refused.set()
            raise RuntimeError("can't start new thread")
        super().start()


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.renewals = 0

    def renew(self, *args: Any, **kwargs: Any) -> Any:
        self.renewals += 1
        return super().renew(*args, **kwargs)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_one_renewal_thread_that_cannot_start_does_not_stop_every_later_renewal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        lease_module,
        "threading",
        SimpleNamespace(Thread=FlakyThread, Condition=threading.Condition),
    )
    store = CountingStore()
    asked = time.monotonic()
    record = store.claim(claim_request(lease=LEASE), datetime.now(UTC)).record
    ctx = Attempt("task", "h", record.run_id, record.attempt_id, record.lease_expires)
    ctx.confirm_lease(record.lease_expires, asked + LEASE.total_seconds())
    keeper = LeaseKeeper(store, lambda: datetime.now(UTC))
    with keeper.kept(ctx, LEASE):
        assert FlakyThread.refused.wait(timeout=30)  # The first renewal could not start.
        deadline = time.monotonic() + 20  # The retry is due 0.05 s after the refusal.
        while store.renewals == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert store.renewals > 0, "no renewal ran after one thread failed to start"
