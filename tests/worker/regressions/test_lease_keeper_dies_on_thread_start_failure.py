"""Finding: the lease keeper's one scheduler thread starts a thread per renewal and has no
error handling; when one ``Thread.start()`` fails (RuntimeError "can't start new thread"
under thread or memory exhaustion), the scheduler thread dies, and with the same pid it is
never restarted: no lease in the process is renewed again, every running handler's lease
lapses and is taken over while it still runs."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from tasklease.worker.delivery.lease import LeaseKeeper
from tasklease.worker.handlers.attempt import Attempt
from tests.support.helpers import claim_request
from tests.support.lease_threads import CountingStore, refuse_one_thread_start

# Renewed every 2 s. The retried renewal must come before the lease lapses by the local clock
# (then no renewal is tried at all): on a loaded machine a 1.5 s lease was too short for that.
LEASE = timedelta(seconds=6)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_one_renewal_thread_that_cannot_start_does_not_stop_every_later_renewal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Refuses to start the first renewal thread.
    refused = refuse_one_thread_start(monkeypatch, lambda name: name.startswith("tasklease-renew"))
    store = CountingStore()
    asked = time.monotonic()
    record = store.claim(claim_request(lease=LEASE), datetime.now(UTC)).record
    ctx = Attempt("task", "h", record.run_id, record.attempt_id, record.lease_expires)
    ctx.confirm_lease(record.lease_expires, asked + LEASE.total_seconds())
    keeper = LeaseKeeper(store, lambda: datetime.now(UTC))
    with keeper.kept(ctx, LEASE):
        assert refused.wait(timeout=30)  # The first renewal could not start.
        deadline = time.monotonic() + 20  # The retry is due 0.05 s after the refusal.
        while store.renewals == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert store.renewals > 0, "no renewal ran after one thread failed to start"
