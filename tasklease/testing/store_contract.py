"""The lease store contract: the tests a store passes to be a tasklease store.

A store's test class inherits the suites of what it implements and provides a ``store``
fixture (a fresh, empty store)::

    import pytest
    from tasklease.testing.store_contract import StoreContract

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store(self):
            store = MyStore(...)
            yield store
            store.close()

- :class:`StoreContract`: the run primitives of :class:`~tasklease.worker.stores.LeaseStore`,
  durable steps (:class:`~tasklease.testing.steps_contract.StepsContract`), waits
  (:class:`~tasklease.testing.waits_contract.WaitsContract`) and cancellation
  (:class:`~tasklease.testing.cancel_contract.CancelContract`) included.
- :class:`LockContract`: :class:`~tasklease.worker.stores.LockStore` (locks).
- :class:`OperationsContract`: :class:`~tasklease.worker.stores.OperatorQueries`.
- :class:`TallyContract`: :class:`~tasklease.worker.stores.base.tally.DeliveryTally`
  (per-minute delivery counts for the dashboard).
- :class:`CrossProcessContract`: for a store several processes share; it also needs a
  ``store_factory`` fixture (a picklable callable opening the same store in another process).
"""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from tasklease import protocol
from tasklease.testing.cancel_contract import CancelContract
from tasklease.testing.contract_support import EXPIRED, LEASE, T0, claim_request
from tasklease.testing.lock_contract import LockContract
from tasklease.testing.operations_contract import OperationsContract
from tasklease.testing.steps_contract import StepsContract
from tasklease.testing.tally_contract import TallyContract
from tasklease.testing.waits_contract import WaitsContract
from tasklease.worker.core.records import RunStatus, Verdict
from tasklease.worker.stores.base.store import LeaseStore


class StoreContract(StepsContract, WaitsContract, CancelContract):
    """Semantics every :class:`LeaseStore` must have (durable steps, waits and cancellation
    included)."""

    def test_first_claim_takes_the_run_with_fencing_token_one(self, store: LeaseStore) -> None:
        claim = store.claim(claim_request(), T0)
        assert claim.verdict is Verdict.CLAIMED
        assert claim.took_over_from is None
        record = claim.record
        assert (record.status, record.attempt_id, record.fencing_token, record.attempts) == (
            RunStatus.IN_PROGRESS,
            "attempt-1",
            1,
            1,
        )
        assert record.lease_expires == T0 + LEASE
        assert record.expire_at == T0 + timedelta(days=7)
        assert store.get("run-1") == record

    def test_claim_while_lease_is_live_answers_in_progress(self, store: LeaseStore) -> None:
        store.claim(claim_request(), T0)
        claim = store.claim(
            claim_request(attempt_id="attempt-2"), T0 + LEASE - timedelta(seconds=1)
        )
        assert claim.verdict is Verdict.IN_PROGRESS
        assert claim.record.attempt_id == "attempt-1"
        assert store.get("run-1").attempt_id == "attempt-1"  # type: ignore[union-attr]

    def test_claim_after_lease_expiry_takes_over_with_a_higher_fencing_token(
        self, store: LeaseStore
    ) -> None:
        store.claim(claim_request(), T0)
        claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)
        assert claim.verdict is Verdict.CLAIMED
        assert claim.took_over_from == "attempt-1"
        assert (claim.record.attempt_id, claim.record.fencing_token, claim.record.attempts) == (
            "attempt-2",
            2,
            2,
        )

    def test_lease_is_not_taken_over_within_the_clock_skew_bound(self, store: LeaseStore) -> None:
        store.claim(claim_request(), T0)
        claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + LEASE)
        assert claim.verdict is Verdict.IN_PROGRESS
        assert store.get("run-1").attempt_id == "attempt-1"  # type: ignore[union-attr]

    def test_completed_run_is_a_duplicate_with_its_stored_result_bytes(
        self, store: LeaseStore
    ) -> None:
        store.claim(claim_request(), T0)
        result_json = '{"count":2,"nested":{"none":null,"ok":true},"sent":["a","\u00e9"]}'
        assert store.complete("run-1", "attempt-1", result_json, T0 + timedelta(seconds=1))
        claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + timedelta(days=1))
        assert claim.verdict is Verdict.COMPLETED
        assert claim.record.result_json == result_json
        expected = {"sent": ["a", "é"], "count": 2, "nested": {"ok": True, "none": None}}
        assert claim.record.result == expected
        assert claim.record.finished_at == T0 + timedelta(seconds=1)

    def test_a_finish_retried_after_it_landed_is_recognised_by_attempt_id(
        self, store: LeaseStore
    ) -> None:
        finishes: list[tuple[str, Callable[[str], bool]]] = [
            ("done", lambda r: store.complete(r, "attempt-1", '"ok"', T0)),
            ("dead", lambda r: store.fail(r, "attempt-1", "bad", T0, "{}")),
            ("back", lambda r: store.release(r, "attempt-1", "boom", T0)),
        ]
        for run_id, finish in finishes:
            store.claim(claim_request(run_id), T0)
            assert finish(run_id)
            assert finish(run_id), f"{run_id}: the retried finish was taken for a lost claim"
        # A different finish by the same attempt is not the one that landed.
        assert not store.complete("dead", "attempt-1", None, T0)

    def test_claim_reads_a_clock_inside_the_atomic_change(self, store: LeaseStore) -> None:
        reads: list[datetime] = []

        def clock() -> datetime:
            reads.append(T0 + timedelta(seconds=len(reads)))
            return reads[-1]

        claim = store.claim(claim_request(), clock)
        assert reads, "the store never read the clock"
        assert claim.record.claimed_at in reads
        assert claim.record.lease_expires == claim.record.claimed_at + LEASE

    def test_a_run_bound_to_its_caller_is_refused_to_another_and_unchanged(
        self, store: LeaseStore
    ) -> None:
        original = store.claim(claim_request(caller="a@p.iam.gserviceaccount.com"), T0).record
        assert original.caller == "a@p.iam.gserviceaccount.com"
        for moment in (T0, T0 + EXPIRED):
            claim = store.claim(
                claim_request(attempt_id="x", caller="b@p.iam.gserviceaccount.com"), moment
            )
            assert claim.verdict is Verdict.FORBIDDEN
        assert store.get("run-1") == original
        taken = store.claim(
            claim_request(attempt_id="a2", caller="a@p.iam.gserviceaccount.com"), T0 + EXPIRED
        )
        assert taken.verdict is Verdict.CLAIMED

    def test_stale_attempt_cannot_finish_a_run_taken_over(self, store: LeaseStore) -> None:
        store.claim(claim_request(), T0)
        store.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)
        later = T0 + EXPIRED + timedelta(seconds=1)
        assert not store.complete("run-1", "attempt-1", '"stale"', later)
        assert not store.fail("run-1", "attempt-1", "stale", later)
        assert not store.release("run-1", "attempt-1", "stale", later)
        assert store.renew("run-1", "attempt-1", LEASE, later) is None
        record = store.get("run-1")
        assert record is not None
        assert (record.status, record.attempt_id, record.result) == (
            RunStatus.IN_PROGRESS,
            "attempt-2",
            None,
        )

    def test_finishing_an_unknown_run_changes_nothing(self, store: LeaseStore) -> None:
        assert not store.complete("missing", "attempt-1", None, T0)
        assert store.renew("missing", "attempt-1", LEASE, T0) is None
        assert store.get("missing") is None

    def test_permanent_failure_is_kept_as_a_dead_letter(self, store: LeaseStore) -> None:
        store.claim(claim_request(), T0)
        assert store.fail("run-1", "attempt-1", "PermanentFailure: bad order", T0, '{"id": 1}')
        claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + LEASE * 10)
        assert claim.verdict is Verdict.FAILED
        assert claim.record.error == "PermanentFailure: bad order"
        assert claim.record.payload == '{"id": 1}'
        assert [r.run_id for r in store.list_runs(RunStatus.FAILED)] == ["run-1"]

    def test_a_dead_letter_of_any_body_a_task_may_carry_is_recorded(
        self, store: LeaseStore
    ) -> None:
        """A NUL or a lone surrogate in the error or the payload (a body that is not JSON),
        and a body as large as Cloud Tasks delivers: the failure is written (a payload the
        record cannot hold is dropped, the error saying so), never refused."""
        store.claim(claim_request(), T0)
        assert store.fail("run-1", "attempt-1", "bad name a\x00\ud800", T0, '{"a": "\x00"}')
        failed = store.get("run-1")
        assert failed is not None and failed.status is RunStatus.FAILED
        assert failed.error is not None and failed.error.startswith("bad name a")
        large = "x" * protocol.MAX_TASK_BYTES
        store.claim(claim_request(run_id="run-2"), T0)
        assert store.fail("run-2", "attempt-1", "PermanentFailure: too many rows", T0, large)
        record = store.get("run-2")
        assert record is not None and record.status is RunStatus.FAILED
        assert record.payload == large or (
            record.payload is None and record.error is not None and "not kept" in record.error
        )

    def test_released_run_is_claimable_at_once_and_fencing_keeps_growing(
        self, store: LeaseStore
    ) -> None:
        store.claim(claim_request(), T0)
        assert store.release("run-1", "attempt-1", "RuntimeError: boom", T0)
        claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + timedelta(milliseconds=1))
        assert claim.verdict is Verdict.CLAIMED
        assert claim.took_over_from is None
        assert (claim.record.fencing_token, claim.record.attempts) == (2, 2)

    def test_renewal_extends_the_lease_of_the_holder_only(self, store: LeaseStore) -> None:
        store.claim(claim_request(), T0)
        assert store.renew("run-1", "attempt-1", LEASE, T0 + LEASE) == T0 + LEASE * 2
        assert store.get("run-1").lease_expires == T0 + LEASE * 2  # type: ignore[union-attr]
        claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)
        assert claim.verdict is Verdict.IN_PROGRESS
        store.complete("run-1", "attempt-1", None, T0)
        assert store.renew("run-1", "attempt-1", LEASE, T0 + LEASE * 2) is None

    def test_record_past_retention_counts_as_absent_but_fencing_continues(
        self, store: LeaseStore
    ) -> None:
        store.claim(claim_request(), T0)
        store.complete("run-1", "attempt-1", None, T0)
        claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + timedelta(days=7))
        assert claim.verdict is Verdict.CLAIMED
        assert claim.record.fencing_token == 2

    def test_a_record_past_retention_passes_no_attempts_to_the_next_claim(
        self, store: LeaseStore
    ) -> None:
        store.claim(claim_request(), T0)
        store.release("run-1", "attempt-1", "RuntimeError: x", T0)
        store.claim(claim_request(attempt_id="attempt-2"), T0)
        store.complete("run-1", "attempt-2", None, T0)
        claim = store.claim(claim_request(attempt_id="attempt-3"), T0 + timedelta(days=7))
        assert (claim.verdict, claim.record.attempts, claim.record.fencing_token) == (
            Verdict.CLAIMED,
            1,
            3,
        )

    def test_purge_deletes_only_expired_records(self, store: LeaseStore) -> None:
        store.claim(claim_request("old"), T0)
        store.claim(claim_request("new", retention=timedelta(days=30)), T0)
        assert store.purge_expired(T0 + timedelta(days=8)) == 1
        assert store.get("old") is None
        assert store.get("new") is not None

    def test_a_stale_finish_is_refused_on_a_run_purged_and_claimed_again(
        self, store: LeaseStore
    ) -> None:
        """A stalled attempt may outlive its run's record (purged past its lease and its
        retention): the run's next claim starts a record its late writes must not touch."""
        store.claim(claim_request(), T0)
        assert store.renew("run-1", "attempt-1", LEASE, T0) is not None
        later = T0 + timedelta(days=8)
        assert store.purge_expired(later) == 1
        store.claim(claim_request(attempt_id="attempt-2"), later)
        assert store.renew("run-1", "attempt-2", LEASE, later) is not None
        assert not store.complete("run-1", "attempt-1", '"stale"', later)
        assert store.renew("run-1", "attempt-1", LEASE, later) is None
        record = store.get("run-1")
        assert record is not None
        assert (record.attempt_id, record.status, record.result_json) == (
            "attempt-2",
            RunStatus.IN_PROGRESS,
            None,
        )

    def test_list_runs_filters_by_status_newest_first(self, store: LeaseStore) -> None:
        for index in range(3):
            store.claim(claim_request(f"run-{index}"), T0 + timedelta(seconds=index))
        store.complete("run-1", "attempt-1", None, T0)
        assert [r.run_id for r in store.list_runs()] == ["run-2", "run-1", "run-0"]
        assert [r.run_id for r in store.list_runs(RunStatus.COMPLETED)] == ["run-1"]
        assert len(store.list_runs(limit=2)) == 2

    def test_times_and_identity_round_trip_exactly(self, store: LeaseStore) -> None:
        moment = T0 + timedelta(microseconds=123_457)
        identity = {"queue": "q", "task_name": "t-ü", "schedule_time": "2026-10-16T12:00:00Z"}
        record = store.claim(claim_request(identity=identity), moment).record
        stored = store.get("run-1")
        assert stored == record
        assert stored is not None
        assert stored.claimed_at == moment
        assert stored.identity == identity

    def test_fifty_threads_claiming_one_run_execute_it_once(self, store: LeaseStore) -> None:
        executions = _race_threads(store, threads=50)
        assert executions == 1
        record = store.get("race")
        assert record is not None
        assert record.status is RunStatus.COMPLETED
        assert record.fencing_token == 1


class CrossProcessContract:
    """For stores that several processes share: the race spans processes."""

    def test_four_processes_claiming_one_run_execute_it_once(
        self, store_factory: Callable[[], LeaseStore]
    ) -> None:
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(4)
        results = context.Queue()
        processes = [
            context.Process(target=_race_in_process, args=(store_factory, barrier, results))
            for _ in range(4)
        ]
        for process in processes:
            process.start()
        executions = [results.get(timeout=60) for _ in processes]
        for process in processes:
            process.join(timeout=10)
            assert process.exitcode == 0
        assert sum(executions) == 1
        record = store_factory().get("race")
        assert record is not None
        assert record.status is RunStatus.COMPLETED


def _race_threads(store: LeaseStore, threads: int, barrier: Any = None) -> int:
    """Deliver one run from ``threads`` threads at once; return how many ran it."""
    start = threading.Barrier(threads)
    executions = 0
    lock = threading.Lock()

    def deliver(index: int) -> None:
        nonlocal executions
        start.wait()
        attempt = f"attempt-{threading.get_ident()}-{index}"
        claim = store.claim(claim_request("race", attempt), T0)
        if claim.verdict is Verdict.CLAIMED:
            with lock:
                executions += 1
            assert store.complete("race", attempt, json.dumps({"by": attempt}), T0)

    if barrier is not None:
        barrier.wait()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(deliver, range(threads)))
    return executions


def _race_in_process(store_factory: Callable[[], LeaseStore], barrier: Any, results: Any) -> None:
    results.put(_race_threads(store_factory(), threads=10, barrier=barrier))


__all__ = [
    "CrossProcessContract",
    "LockContract",
    "OperationsContract",
    "StoreContract",
    "TallyContract",
]
