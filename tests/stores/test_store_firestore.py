"""FirestoreStore: the shared contract, its round trips, and every error branch."""

from __future__ import annotations

import functools
import multiprocessing
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from google.api_core import exceptions as api
from google.cloud.firestore_v1.document import DocumentReference

from tasklease.errors import StoreUnavailable
from tasklease.testing.contract_support import EXPIRED, LEASE, lock_request
from tasklease.testing.fan_in_contract import FanInContract, FanInCrossProcess
from tasklease.testing.store_contract import (
    CrossProcessContract,
    LockContract,
    OperationsContract,
    StoreContract,
    TallyContract,
)
from tasklease.worker import Router, create_app
from tasklease.worker.core.locking import token_floor
from tasklease.worker.core.records import RunRecord, RunStatus, Verdict
from tasklease.worker.stores import FirestoreStore, LockStore, store_from_url
from tasklease.worker.stores.base.conditional_claims import Versioned
from tasklease.worker.stores.base.fan_ins import FanInStore
from tasklease.worker.stores.base.store import LeaseStore
from tests.support.firestore import IGNORES_UPDATE_TIME, PROJECT, RpcCounter, unique_collection
from tests.support.firestore_faults import LANDED_THEN_FAILED, Scripted
from tests.support.helpers import T0, FakeClock, claim_request, job_headers, task_headers
from tests.support.stores import ReceiptWorker, closed_after_the_test


def new_store(collection: str | None = None, **options: Any) -> FirestoreStore:
    return closed_after_the_test(
        FirestoreStore.from_options(
            collection=collection or unique_collection(), project=PROJECT, **options
        )
    )


class TestFirestoreStore(
    StoreContract,
    LockContract,
    FanInContract,
    OperationsContract,
    CrossProcessContract,
    FanInCrossProcess,
    TallyContract,
):
    @pytest.fixture
    def store(self, firestore_host: str | None) -> FirestoreStore:
        return new_store()

    @pytest.fixture
    def store_factory(self, firestore_host: str | None) -> functools.partial[FirestoreStore]:
        return functools.partial(
            FirestoreStore.from_options, collection=unique_collection(), project=PROJECT
        )

    @IGNORES_UPDATE_TIME
    def test_stale_attempt_cannot_finish_a_run_taken_over(self, store: LeaseStore) -> None:
        super().test_stale_attempt_cannot_finish_a_run_taken_over(store)

    @IGNORES_UPDATE_TIME
    def test_twenty_runs_racing_for_one_lock_one_acquires_it(self, store: LockStore) -> None:
        super().test_twenty_runs_racing_for_one_lock_one_acquires_it(store)

    @IGNORES_UPDATE_TIME
    def test_children_finishing_at_once_count_exactly_once_each(self, store: FanInStore) -> None:
        super().test_children_finishing_at_once_count_exactly_once_each(store)

    @IGNORES_UPDATE_TIME
    def test_children_in_four_processes_count_once_each(
        self, store_factory: Callable[[], FanInStore]
    ) -> None:
        super().test_children_in_four_processes_count_once_each(store_factory)


@IGNORES_UPDATE_TIME
def test_stale_attempt_in_another_process_cannot_finish(firestore_host: str | None) -> None:
    """The attempt that lost its lease runs elsewhere: only the precondition can refuse it."""
    collection = unique_collection()
    stale, fresh = new_store(collection), new_store(collection)
    stale.claim(claim_request(), T0)
    fresh.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)
    assert not stale.complete("run-1", "attempt-1", '"stale"', T0 + EXPIRED)
    assert fresh.get("run-1").attempt_id == "attempt-2"  # type: ignore[union-attr]


# The takeover race: processes, each with its own client, take over one expired lease at once.
RACERS = 8
ROUNDS = 5
# Rounds this far apart find the previous winner's lease long expired, the record retained.
ROUND_STEP = LEASE + timedelta(hours=1)


def _takeover_racer(collection: str, index: int, barrier: Any, results: Any) -> None:
    """One racing process: per round, wait for the others, then claim the contested run."""
    store = FirestoreStore.from_options(collection=collection, project=PROJECT)
    writes = 0
    conditional_update = store.runs.write_if_version

    def counted(
        before: Versioned[datetime], record: RunRecord, *, finishing: bool = False
    ) -> datetime | None:
        nonlocal writes
        writes += 1
        return conditional_update(before, record, finishing=finishing)

    store.runs.write_if_version = counted  # type: ignore[method-assign]
    try:
        store.get("contested")  # Connect before the race, so the race is about the write.
        for round_ in range(ROUNDS):
            barrier.wait(timeout=120)
            writes = 0
            attempt = f"round-{round_}-racer-{index}"
            claim = store.claim(claim_request("contested", attempt), T0 + ROUND_STEP * (round_ + 1))
            results.put((round_, attempt, claim.verdict.value, claim.record.attempt_id, writes))
    finally:
        store.close()


@IGNORES_UPDATE_TIME
def test_eight_processes_taking_over_one_expired_lease_have_exactly_one_winner(
    firestore_host: str | None,
) -> None:
    collection = unique_collection()
    store = new_store(collection)
    store.claim(claim_request("contested", "original"), T0)  # Its lease expires unrenewed.
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(RACERS)
    results = context.Queue()
    processes = [
        context.Process(target=_takeover_racer, args=(collection, index, barrier, results))
        for index in range(RACERS)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=180) for _ in range(RACERS * ROUNDS)]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    winners = []
    for round_ in range(ROUNDS):
        this_round = [o for o in outcomes if o[0] == round_]
        claimed = [attempt for _, attempt, verdict, _, _ in this_round if verdict == "claimed"]
        assert len(claimed) == 1, f"round {round_}: {this_round}"
        winners.extend(claimed)
        # Every loser saw the winner's claim, whether it lost the write or read it afterwards.
        assert {(v, holder) for _, a, v, holder, _ in this_round if a not in claimed} == {
            ("in_progress", claimed[0])
        }
        contenders = sum(1 for *_, writes in this_round if writes)
        print(f"round {round_}: winner {claimed[0]}, {contenders} of {RACERS} tried the write")
    record = store.get("contested")
    assert record is not None
    assert (record.attempt_id, record.fencing_token, record.attempts) == (
        winners[-1],
        ROUNDS + 1,
        ROUNDS + 1,
    )


def test_worker_runs_on_firestore_through_the_app(firestore_host: str | None) -> None:
    worker = ReceiptWorker(new_store())
    assert worker.outcomes(3) == ["processed", "duplicate", "duplicate"]
    assert len(worker.runs) == 1


def test_delivery_rpc_counts_two_per_first_execution_one_per_retried_duplicate(
    firestore_host: str | None,
) -> None:
    router = Router()
    router.task("send_receipt")(lambda payload, ctx: {"ok": True})
    store = new_store()
    app = create_app(router, store=store, auth="none")
    rpcs = RpcCounter(store.client)

    def deliver(retry: int) -> str:
        headers = task_headers(retry=retry, execution=retry)
        response = app.test_client().post("/tasks/send_receipt", headers=headers, data=b"{}")
        return str(response.headers["X-Tasklease-Outcome"])

    assert deliver(0) == "processed"
    assert rpcs.take() == ["commit", "commit"]  # create, then the conditional completion.
    assert deliver(1) == "duplicate"
    assert rpcs.take() == ["batch_get_documents"]  # A retry reads first: one RPC.
    assert deliver(0) == "duplicate"  # Not marked as a retry: create-first, then a read.
    assert rpcs.take() == ["commit", "batch_get_documents"]


def test_store_url_selects_firestore(firestore_host: str | None) -> None:
    store = store_from_url(f"firestore://?collection=abc&database=(default)&project={PROJECT}")
    assert isinstance(store, FirestoreStore)
    assert store.collection == "abc"


@pytest.fixture
def counted(firestore_host: str | None) -> tuple[FirestoreStore, RpcCounter]:
    store = new_store()
    return store, RpcCounter(store.client)


def test_first_execution_costs_two_rpcs(counted: tuple[FirestoreStore, RpcCounter]) -> None:
    store, rpcs = counted
    assert store.claim(claim_request(), T0).verdict is Verdict.CLAIMED
    assert store.complete("run-1", "attempt-1", '{"ok":true}', T0)
    assert rpcs.take() == ["commit", "commit"]  # create(), then a conditional update().


def test_a_lock_is_one_document_changed_without_transactions(
    counted: tuple[FirestoreStore, RpcCounter],
) -> None:
    store, rpcs = counted
    assert store.acquire_lock(lock_request(min_gap=LEASE), T0).acquired
    assert rpcs.take() == ["batch_get_documents", "commit"]  # get(), then create().
    assert store.renew_lock("job/nightly", "a1", LEASE, T0 + LEASE / 3) == T0 + LEASE / 3 + LEASE
    assert store.release_lock("job/nightly", "a1", T0 + LEASE / 2)
    assert rpcs.take() == ["batch_get_documents", "commit"] * 2  # get(), conditional update().
    assert not store.acquire_lock(lock_request("run-b", "b1"), T0 + LEASE / 2).acquired
    assert rpcs.take() == ["batch_get_documents"]  # Busy: a read decides, nothing written.


def test_a_lock_held_by_a_live_holder_costs_a_read_of_its_holders_run_too(
    counted: tuple[FirestoreStore, RpcCounter],
) -> None:
    store, rpcs = counted
    store.claim(claim_request("run-a", "a1"), T0)
    assert store.acquire_lock(lock_request(), T0).acquired
    rpcs.take()
    assert not store.acquire_lock(lock_request("run-b", "b1"), T0 + LEASE / 2).acquired
    assert rpcs.take() == ["batch_get_documents"] * 2  # The lock, then the holder's run.


@IGNORES_UPDATE_TIME
def test_a_lock_write_that_landed_unseen_is_recognised_by_attempt_id(
    firestore_host: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = new_store()
    original = DocumentReference.create

    def create_then_fail(self: DocumentReference, *args: Any, **kwargs: Any) -> Any:
        original(self, *args, **kwargs)
        raise api.ServiceUnavailable("the create landed, its answer was lost")

    monkeypatch.setattr(DocumentReference, "create", create_then_fail)
    grant = store.acquire_lock(lock_request(), T0)
    assert grant.acquired
    assert grant.lock.holder_attempt_id == "a1"
    assert grant.lock.fencing_token == token_floor(T0)


def test_duplicate_costs_two_rpcs(counted: tuple[FirestoreStore, RpcCounter]) -> None:
    store, rpcs = counted
    store.claim(claim_request(), T0)
    store.complete("run-1", "attempt-1", None, T0)
    rpcs.take()
    assert store.claim(claim_request(attempt_id="attempt-2"), T0).verdict is Verdict.COMPLETED
    assert rpcs.take() == ["commit", "batch_get_documents"]  # The failed create, one read.


def test_takeover_costs_three_rpcs_and_no_transaction(
    counted: tuple[FirestoreStore, RpcCounter],
) -> None:
    store, rpcs = counted
    store.claim(claim_request(), T0)
    rpcs.take()
    claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)
    assert (claim.verdict, claim.took_over_from) == (Verdict.CLAIMED, "attempt-1")
    assert rpcs.take() == ["commit", "batch_get_documents", "commit"]


def test_renewal_costs_one_rpc(counted: tuple[FirestoreStore, RpcCounter]) -> None:
    store, rpcs = counted
    store.claim(claim_request(), T0)
    rpcs.take()
    assert store.renew("run-1", "attempt-1", LEASE, T0 + LEASE)
    assert rpcs.take() == ["commit"]


@pytest.fixture
def scripted(
    firestore_host: str | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[FirestoreStore, Scripted]:
    store = new_store()
    return store, Scripted(store, monkeypatch)


def test_create_retried_by_the_client_after_it_succeeded_is_still_our_claim(
    scripted: tuple[FirestoreStore, Scripted],
) -> None:
    store, document = scripted
    document.fail("create", api.Conflict("already exists"), after_running=True)
    claim = store.claim(claim_request(), T0)
    assert claim.verdict is Verdict.CLAIMED
    assert claim.record.attempt_id == "attempt-1"
    assert store.complete("run-1", "attempt-1", None, T0)


@pytest.mark.parametrize(
    "error",
    [
        api.ServiceUnavailable("down"),
        api.DeadlineExceeded("slow"),
        api.InternalServerError("boom"),
        api.RetryError("gave up", None),
        api.PermissionDenied("no"),
    ],
)
def test_firestore_errors_at_claim_time_are_store_unavailable(
    scripted: tuple[FirestoreStore, Scripted], error: Exception
) -> None:
    store, document = scripted
    document.fail("create", error)
    with pytest.raises(StoreUnavailable, match="could not claim"):
        store.claim(claim_request(), T0)
    assert store.get("run-1") is None  # Nothing was claimed.


def test_error_when_reading_after_a_conflict_is_store_unavailable(
    scripted: tuple[FirestoreStore, Scripted],
) -> None:
    store, document = scripted
    store.claim(claim_request(), T0)
    document.fail("get", api.ServiceUnavailable("down"))
    with pytest.raises(StoreUnavailable):
        store.claim(claim_request(attempt_id="attempt-2"), T0)


def test_lost_update_time_race_rereads_and_still_finishes(
    scripted: tuple[FirestoreStore, Scripted],
) -> None:
    store, document = scripted
    store.claim(claim_request(), T0)
    # Our own renewal (another thread) moved the document on: the precondition fails once.
    document.fail("update", api.FailedPrecondition("update_time mismatch"))
    assert store.complete("run-1", "attempt-1", '"done"', T0)
    assert store.get("run-1").status is RunStatus.COMPLETED  # type: ignore[union-attr]


def test_update_retried_by_the_client_after_it_succeeded_counts_as_done(
    scripted: tuple[FirestoreStore, Scripted],
) -> None:
    store, document = scripted
    store.claim(claim_request(), T0)
    document.fail("update", api.FailedPrecondition("update_time mismatch"), after_running=True)
    assert store.complete("run-1", "attempt-1", '"done"', T0)
    assert store.get("run-1").result == "done"  # type: ignore[union-attr]


def test_takeover_race_lost_to_another_attempt_reads_its_claim(
    scripted: tuple[FirestoreStore, Scripted],
) -> None:
    store, document = scripted
    store.claim(claim_request(), T0)
    rival = new_store(store.collection)
    # Between our read and our conditional update, attempt-3 takes the expired run over.
    document.fail(
        "update",
        api.FailedPrecondition("update_time mismatch"),
        before=lambda: rival.claim(claim_request(attempt_id="attempt-3"), T0 + EXPIRED),
    )
    claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)
    assert claim.verdict is Verdict.IN_PROGRESS
    assert claim.record.attempt_id == "attempt-3"


def test_finish_write_failing_is_store_unavailable(
    scripted: tuple[FirestoreStore, Scripted],
) -> None:
    store, document = scripted
    store.claim(claim_request(), T0)
    document.fail("update", api.ServiceUnavailable("down"))
    with pytest.raises(StoreUnavailable):
        store.complete("run-1", "attempt-1", None, T0)


def test_oversized_error_text_is_cut_with_a_note(firestore_host: str | None) -> None:
    store = new_store()
    store.claim(claim_request(), T0)
    store.fail("run-1", "attempt-1", "e" * 100_000, T0, payload="{}")
    assert "[cut:" in store.get("run-1").error  # type: ignore[operator,union-attr]


def test_expire_at_is_a_firestore_timestamp_for_the_ttl_policy(firestore_host: str | None) -> None:
    store = new_store()
    store.claim(claim_request(), T0)
    raw = store.run_document("run-1").get().to_dict()
    assert type(raw["expire_at"]).__name__ == "DatetimeWithNanoseconds"


def test_aborted_create_is_retried_and_persistent_contention_is_store_unavailable(
    scripted: tuple[FirestoreStore, Scripted],
) -> None:
    store, document = scripted
    document.fail("create", api.Aborted("contention"))
    assert store.claim(claim_request(), T0).verdict is Verdict.CLAIMED
    for _ in range(8):
        document.fail("create", api.Aborted("contention"))
    with pytest.raises(StoreUnavailable, match="contention"):
        store.claim(claim_request("run-1", "attempt-9"), T0)


def test_claim_reads_the_clock_again_before_each_write(
    scripted: tuple[FirestoreStore, Scripted],
) -> None:
    store, document = scripted
    clock = FakeClock()
    # The first create meets contention after a slow round trip: the retry must not write a
    # lease computed from the time read before it.
    document.fail("create", api.Aborted("contention"), before=lambda: clock.advance(LEASE))
    claim = store.claim(claim_request(), clock)
    assert claim.record.claimed_at == T0 + LEASE
    assert claim.record.lease_expires == T0 + LEASE * 2


def test_unreachable_firestore_is_store_unavailable_within_the_call_timeout(
    firestore_host: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", "127.0.0.1:9")
    store = new_store(call_timeout=1.0)
    with pytest.raises(StoreUnavailable, match="could not claim"):
        store.claim(claim_request(), T0)


# A write that lands although its call fails: the client gives up (deadline passed, connection
# lost) after the server committed. Only the stored attempt id tells it from a write not made.
def test_claim_whose_create_landed_but_whose_call_failed_is_our_claim(
    scripted: tuple[FirestoreStore, Scripted],
) -> None:
    store, document = scripted
    document.fail("create", LANDED_THEN_FAILED, after_running=True)
    claim = store.claim(claim_request(), T0)
    assert (claim.verdict, claim.record.attempt_id) == (Verdict.CLAIMED, "attempt-1")
    assert store.complete("run-1", "attempt-1", None, T0)


def test_landed_create_that_cannot_be_read_back_does_not_block_the_retry_for_a_lease(
    scripted: tuple[FirestoreStore, Scripted],
) -> None:
    store, document = scripted
    document.fail("create", LANDED_THEN_FAILED, after_running=True)
    document.fail("get", api.ServiceUnavailable("down"))
    with pytest.raises(StoreUnavailable):
        store.claim(claim_request(), T0)  # The delivery answers 503; nothing ran.
    # Cloud Tasks retries at once, well within the orphan's lease: it must run the task.
    claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + timedelta(seconds=1))
    assert claim.verdict is Verdict.CLAIMED
    assert (claim.record.attempt_id, claim.record.fencing_token) == ("attempt-2", 2)


def test_landed_create_that_cannot_be_read_back_is_released_in_the_background(
    scripted: tuple[FirestoreStore, Scripted],
) -> None:
    store, document = scripted
    document.fail("create", LANDED_THEN_FAILED, after_running=True)
    document.fail("get", api.ServiceUnavailable("down"))
    with pytest.raises(StoreUnavailable):
        store.claim(claim_request(), T0)
    observer = new_store(store.collection)  # Another instance, which this one never calls.
    deadline = time.monotonic() + 30
    while (record := observer.get("run-1")) is None or record.status is RunStatus.IN_PROGRESS:
        assert time.monotonic() < deadline, f"still held: {record}"
        time.sleep(0.1)
    assert (record.status, record.attempt_id) == (RunStatus.RELEASED, "attempt-1")


def test_landed_create_is_not_released_once_it_is_no_longer_held_by_its_attempt(
    scripted: tuple[FirestoreStore, Scripted],
) -> None:
    store, document = scripted
    document.fail("create", LANDED_THEN_FAILED, after_running=True)
    document.fail("get", api.ServiceUnavailable("down"))
    with pytest.raises(StoreUnavailable):
        store.claim(claim_request(), T0)
    # The orphan's lease expires and another instance takes the run over before any release.
    rival = new_store(store.collection)
    assert rival.claim(claim_request(attempt_id="attempt-2"), T0 + LEASE * 2).verdict is (
        Verdict.CLAIMED
    )
    # A later delivery of the run here: the release runs first and must leave attempt-2 alone.
    claim = store.claim(claim_request(attempt_id="attempt-3"), T0 + LEASE * 2)
    assert (claim.verdict, claim.record.attempt_id) == (Verdict.IN_PROGRESS, "attempt-2")
    record = store.get("run-1")
    assert record is not None
    assert (record.status, record.attempt_id) == (RunStatus.IN_PROGRESS, "attempt-2")


@pytest.mark.parametrize("finish", ["complete", "fail", "release"])
def test_finish_whose_write_landed_but_whose_call_failed_succeeds_when_retried(
    scripted: tuple[FirestoreStore, Scripted], finish: str
) -> None:
    store, document = scripted
    store.claim(claim_request(), T0)
    document.fail("update", LANDED_THEN_FAILED, after_running=True)
    call: Callable[[datetime], bool] = {
        "complete": lambda now: store.complete("run-1", "attempt-1", '{"ok":true}', now),
        "fail": lambda now: store.fail("run-1", "attempt-1", "PermanentFailure: no", now, "{}"),
        "release": lambda now: store.release("run-1", "attempt-1", "RuntimeError: boom", now),
    }[finish]
    with pytest.raises(StoreUnavailable):
        call(T0)
    # The executor retries at once, reading its clock again: our write is there, not lost.
    assert call(T0 + timedelta(seconds=1))


def test_finish_of_another_kind_by_the_same_attempt_is_not_taken_as_landed(
    scripted: tuple[FirestoreStore, Scripted],
) -> None:
    store, _ = scripted
    store.claim(claim_request(), T0)
    assert store.release("run-1", "attempt-1", "RuntimeError: boom", T0)
    assert not store.complete("run-1", "attempt-1", None, T0)
    assert store.renew("run-1", "attempt-1", LEASE, T0) is None


def test_worker_retries_a_finish_that_landed_and_answers_processed(
    firestore_host: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = new_store()
    scripted = Scripted(store, monkeypatch)
    scripted.fail("update", LANDED_THEN_FAILED, after_running=True)
    worker = ReceiptWorker(store)
    reply = worker.deliver()
    assert (reply.status_code, reply.headers["X-Tasklease-Outcome"]) == (200, "processed")
    assert len(worker.runs) == 1


def test_worker_answers_503_then_runs_the_retry_when_a_landed_claim_cannot_be_read(
    firestore_host: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = new_store()
    scripted = Scripted(store, monkeypatch)
    scripted.fail("create", LANDED_THEN_FAILED, after_running=True)
    scripted.fail("get", api.ServiceUnavailable("down"))
    worker = ReceiptWorker(store)
    outcomes = [worker.deliver(retry) for retry in range(2)]
    assert [(r.status_code, r.headers["X-Tasklease-Outcome"]) for r in outcomes] == [
        (503, "unavailable"),
        (200, "processed"),
    ]
    assert len(worker.runs) == 1


@IGNORES_UPDATE_TIME
def test_purge_does_not_delete_a_run_taken_over_after_it_read_it(
    firestore_host: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = new_store()
    store.claim(claim_request(), T0)
    later = T0 + timedelta(days=8)  # Past retention: purge reads it as expired.
    rival = new_store(store.collection)
    delete = DocumentReference.delete

    def taken_over_first(self: DocumentReference, *args: Any, **kwargs: Any) -> Any:
        rival.claim(claim_request(attempt_id="attempt-2"), later)
        return delete(self, *args, **kwargs)

    monkeypatch.setattr(DocumentReference, "delete", taken_over_first)
    assert store.purge_expired(later) == 0
    record = store.get("run-1")
    assert record is not None
    assert (record.attempt_id, record.status) == ("attempt-2", RunStatus.IN_PROGRESS)


@IGNORES_UPDATE_TIME
def test_an_exclusive_job_on_firestore_skips_an_overlap_without_transactions(
    firestore_host: str | None,
) -> None:
    router = Router()
    ran: list[str] = []
    second: dict[str, Any] = {}

    @router.scheduled("nightly", exclusive=True, max_runtime=timedelta(hours=1))
    def nightly(ctx: Any) -> None:
        ran.append(ctx.run_id)
        # Another slot arrives while this run holds the job.
        second["response"] = app.test_client().post(
            "/jobs/nightly", headers=job_headers("nightly", "2026-10-16T12:30:00Z")
        )

    store = new_store()
    app = create_app(router, store=store, auth="none", clock=FakeClock(T0 + timedelta(hours=1)))
    rpcs = RpcCounter(store.client)
    first = app.test_client().post("/jobs/nightly", headers=job_headers())
    assert first.headers["X-Tasklease-Outcome"] == "processed"
    skipped = second["response"]
    assert skipped.headers["X-Tasklease-Outcome"] == "skipped_overlap"
    assert skipped.json["held_by"] == ran[0]
    assert len(ran) == 1
    assert "begin_transaction" not in rpcs.take()
    [record] = store.list_runs(RunStatus.SKIPPED)
    assert record.result == {"held_by": ran[0], "lock": "job///nightly"}
    lock = store.get_lock("job///nightly")
    assert lock is not None
    assert (lock.holder_run_id, lock.released) == (ran[0], True)
