"""Finding: a renewal can leave ``expire_at == lease_expires``; past ``expire_at`` a record
counts as absent, so a takeover skips the MAX_CLOCK_SKEW grace (and, once purged, the
fencing token and attempt count start again from 1)."""

from __future__ import annotations

from datetime import timedelta

from tasklease.worker.core.records import Verdict
from tasklease.worker.stores.memory.store import MemoryStore
from tests.support.helpers import T0, claim_request


def test_a_renewed_lease_is_not_taken_over_within_the_clock_skew_grace() -> None:
    store = MemoryStore()
    lease = timedelta(seconds=60)
    request = claim_request(lease=lease, retention=timedelta(seconds=90))  # Valid: > lease.
    first = store.claim(request, T0)
    assert first.verdict is Verdict.CLAIMED
    # The handler runs long; the keeper renews at T0+50 s: lease to T0+110 s.
    expires = store.renew(request.run_id, request.attempt_id, lease, T0 + timedelta(seconds=50))
    assert expires == T0 + timedelta(seconds=110)
    # Another instance whose clock runs 0.5 s ahead (under MAX_CLOCK_SKEW = 1 s) asks at the
    # holder's T0+110 s: the holder may still be running, so this must not be a takeover.
    other = store.claim(
        claim_request(attempt_id="attempt-2", lease=lease), expires + timedelta(seconds=0.5)
    )
    assert other.verdict is Verdict.IN_PROGRESS


def test_the_fencing_token_never_repeats_after_a_long_run_is_taken_over() -> None:
    store = MemoryStore()
    lease = timedelta(seconds=60)
    request = claim_request(lease=lease, retention=timedelta(seconds=90))
    first = store.claim(request, T0)
    moment = T0
    for _ in range(3):  # A long handler: three renewals.
        moment += timedelta(seconds=20)
        # As the worker's lease keeper renews: kept the handler's retention past the lease.
        expires = store.renew(
            request.run_id, request.attempt_id, lease, moment, keep_for=request.retention
        )
    assert expires is not None
    # The holder's instance dies. A claim elsewhere purges expired records now and then.
    store.purge_expired(expires + timedelta(seconds=2))
    taken = store.claim(
        claim_request(attempt_id="attempt-2", lease=lease), expires + timedelta(seconds=2)
    )
    assert taken.verdict is Verdict.CLAIMED
    assert taken.record.fencing_token > first.record.fencing_token
    assert taken.record.attempts == 2
