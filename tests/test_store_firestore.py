"""FirestoreStore: the shared contract, its round trips, and every error branch."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions as api

from tests.firestore_support import IGNORES_UPDATE_TIME, PROJECT, RpcCounter, unique_collection
from tests.helpers import T0, claim_request, task_headers
from tests.store_contract import EXPIRED, LEASE, CrossProcessContract, StoreContract
from worker import Router, create_app
from worker.errors import StoreUnavailable
from worker.records import RunStatus, Verdict
from worker.stores import FirestoreStore, store_from_url

_open: list[FirestoreStore] = []


def new_store(collection: str | None = None, **options: Any) -> FirestoreStore:
    store = FirestoreStore.from_options(
        collection=collection or unique_collection(), project=PROJECT, **options
    )
    _open.append(store)
    return store


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    while _open:
        _open.pop().close()


class TestFirestoreStore(StoreContract, CrossProcessContract):
    @pytest.fixture
    def store(self, firestore_host: str | None) -> FirestoreStore:
        return new_store()

    @pytest.fixture
    def store_factory(self, firestore_host: str | None) -> functools.partial[FirestoreStore]:
        return functools.partial(
            FirestoreStore.from_options, collection=unique_collection(), project=PROJECT
        )

    @IGNORES_UPDATE_TIME
    def test_stale_attempt_cannot_finish_a_run_taken_over(self, store: FirestoreStore) -> None:
        super().test_stale_attempt_cannot_finish_a_run_taken_over(store)


@IGNORES_UPDATE_TIME
def test_stale_attempt_in_another_process_cannot_finish(firestore_host: str | None) -> None:
    """The attempt that lost its lease runs elsewhere: only the precondition can refuse it."""
    collection = unique_collection()
    stale, fresh = new_store(collection), new_store(collection)
    stale.claim(claim_request(), T0)
    fresh.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)
    assert not stale.complete("run-1", "attempt-1", '"stale"', T0 + EXPIRED)
    assert fresh.get("run-1").attempt_id == "attempt-2"  # type: ignore[union-attr]


def test_worker_runs_on_firestore_through_the_app(firestore_host: str | None) -> None:
    router = Router()
    runs: list[str] = []
    router.task("send_receipt")(lambda payload, ctx: runs.append(ctx.run_id))
    store = new_store()
    app = create_app(router, store=store, auth="none")
    outcomes = [
        app.test_client()
        .post("/tasks/send_receipt", headers=task_headers(), data=b"{}")
        .headers["X-Tasklease-Outcome"]
        for _ in range(3)
    ]
    assert outcomes == ["processed", "duplicate", "duplicate"]
    assert len(runs) == 1


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


class Scripted:
    """A DocumentReference whose next calls raise first (after or before really running)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.script: dict[str, list[tuple[BaseException, bool, Any]]] = {}

    def fail(
        self, method: str, error: BaseException, *, after_running: bool = False, before: Any = None
    ) -> None:
        """The next ``method`` call runs ``before()``, then (maybe) really runs, then raises."""
        self.script.setdefault(method, []).append((error, after_running, before))

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if name not in ("create", "update", "get"):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            steps = self.script.get(name)
            if steps:
                error, after_running, before = steps.pop(0)
                if before is not None:
                    before()
                if after_running:
                    target(*args, **kwargs)
                raise error
            return target(*args, **kwargs)

        return call


@pytest.fixture
def scripted(
    firestore_host: str | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[FirestoreStore, Scripted]:
    store = new_store()
    document = Scripted(store._document("run-1"))
    monkeypatch.setattr(store, "_document", lambda run_id: document)
    return store, document


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
    raw = store._document("run-1").get().to_dict()
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


def test_unreachable_firestore_is_store_unavailable_within_the_call_timeout(
    firestore_host: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", "127.0.0.1:9")
    store = new_store(call_timeout=1.0)
    with pytest.raises(StoreUnavailable, match="could not claim"):
        store.claim(claim_request(), T0)
