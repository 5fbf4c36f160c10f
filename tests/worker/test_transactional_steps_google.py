"""Transactional durable steps (``ctx.step(..., transactional=True)``) on SpannerStore and
FirestoreStore, against Google's emulators: the step's writes through the store's own
``Transaction`` and its record commit together, only for the attempt holding the claim; a
transaction the database runs again runs the step's function again, counted."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from google.api_core import exceptions as api
from google.cloud import firestore
from google.cloud.spanner_v1.transaction import Transaction as SpannerTransaction

from tasklease.errors import StoreUnavailable
from tasklease.testing.contract_support import LEASE, T0, claim_request
from tasklease.testing.transactional_step_contract import TransactionalStepContract
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core import steps
from tasklease.worker.core.identity import DeliveryIdentity, Kind
from tasklease.worker.core.records import RunStatus
from tasklease.worker.core.steps import StepRecord
from tasklease.worker.stores import FirestoreStore, SpannerStore
from tests.support.firestore import PROJECT, RpcCounter, unique_collection
from tests.support.helpers import task_headers
from tests.support.spanner import RpcCounter as SpannerRpcCounter

EFFECTS_DDL = "CREATE TABLE effects (id STRING(36) NOT NULL, key STRING(100)) PRIMARY KEY (id)"


def _string() -> Any:
    from google.cloud import spanner  # noqa: PLC0415 - the optional extra, on use only.

    return spanner.param_types.STRING


def _spanner_effects(store: SpannerStore) -> tuple[Callable[[Any, str], None], Callable[..., int]]:
    """Write one effect row through a Spanner transaction; count them outside any."""

    def write(tx: Any, key: str) -> None:
        tx.execute_update(
            "INSERT INTO effects (id, key) VALUES (@id, @key)",
            params={"id": str(uuid.uuid4()), "key": key},
            param_types={"id": _string(), "key": _string()},
        )

    def count(key: str) -> int:
        with store.database.snapshot() as snapshot:
            rows = snapshot.execute_sql(
                "SELECT COUNT(*) FROM effects WHERE key = @key",
                params={"key": key},
                param_types={"key": _string()},
            )
            return int(next(iter(rows))[0])

    return write, count


def _firestore_effects(
    store: FirestoreStore,
) -> tuple[Callable[[Any, str], None], Callable[[str], int]]:
    """Add 1 to a counter document through a Firestore transaction; read it outside."""
    effects = store.client.collection(f"effects_{uuid.uuid4().hex[:8]}")

    def write(tx: Any, key: str) -> None:
        tx.set(effects.document(key), {"n": firestore.Increment(1)}, merge=True)

    def count(key: str) -> int:
        snapshot = effects.document(key).get()
        return int(snapshot.get("n")) if snapshot.exists else 0

    return write, count


@pytest.fixture
def spanner_store(spanner_database: str) -> Iterator[SpannerStore]:
    store = SpannerStore(spanner_database, call_timeout=5.0)
    store.database.update_ddl([EFFECTS_DDL]).result(60)
    yield store
    store.close()


@pytest.fixture
def firestore_store(firestore_host: str | None) -> Iterator[FirestoreStore]:
    store = FirestoreStore.from_options(collection=unique_collection(), project=PROJECT)
    yield store
    store.close()


class TestSpannerTransactionalSteps(TransactionalStepContract):
    @pytest.fixture
    def store(self, spanner_store: SpannerStore) -> SpannerStore:
        return spanner_store

    @pytest.fixture
    def write_effect(self, store: SpannerStore) -> Callable[[Any, str], None]:
        return _spanner_effects(store)[0]

    @pytest.fixture
    def count_effects(self, store: SpannerStore) -> Callable[[str], int]:
        return _spanner_effects(store)[1]


class TestFirestoreTransactionalSteps(TransactionalStepContract):
    @pytest.fixture
    def store(self, firestore_store: FirestoreStore) -> FirestoreStore:
        return firestore_store

    @pytest.fixture
    def effects(self, store: FirestoreStore) -> tuple[Any, Any]:
        return _firestore_effects(store)

    @pytest.fixture
    def write_effect(self, effects: tuple[Any, Any]) -> Callable[[Any, str], None]:
        write: Callable[[Any, str], None] = effects[0]
        return write

    @pytest.fixture
    def count_effects(self, effects: tuple[Any, Any]) -> Callable[[str], int]:
        count: Callable[[str], int] = effects[1]
        return count


def _step(write: Callable[[Any, str], None], key: str) -> Callable[[Any], StepRecord]:
    def work(tx: Any) -> StepRecord:
        write(tx, key)
        return StepRecord(key, "1", "attempt-1", T0, 1)

    return work


def test_a_spanner_transactional_step_costs_two_rpcs_beyond_its_own_statements(
    spanner_store: SpannerStore,
) -> None:
    """The step's own DML (beginning the transaction inline), the row's read, the Commit;
    the completion after it is the store's usual one transaction."""
    write, count = _spanner_effects(spanner_store)
    spanner_store.get("warm-up")
    rpcs = SpannerRpcCounter(spanner_store.database)
    spanner_store.claim(claim_request(), T0)
    claim = rpcs.take()
    outcome = spanner_store.record_step_in_transaction("run-1", "attempt-1", _step(write, "a"), T0)
    step = rpcs.take()
    print(f"spanner transactional step: claim {claim}, step {step}")
    assert (outcome.held, outcome.tries) == (True, 1)
    assert claim == ["commit"]
    assert step == ["execute_sql", "streaming_read", "commit"]
    assert count("a") == 1


def test_a_firestore_transactional_step_costs_three_rpcs_and_the_next_renewal_one(
    firestore_store: FirestoreStore,
) -> None:
    """BeginTransaction, the run's read, the Commit (the step's writes and its record). The
    store remembers the document's update time from that Commit, so the attempt's next
    renewal is one conditional write, no read."""
    write, count = _firestore_effects(firestore_store)
    rpcs = RpcCounter(firestore_store.client)
    firestore_store.claim(claim_request(), T0)
    rpcs.take()
    work = _step(write, "a")
    assert firestore_store.record_step_in_transaction("run-1", "attempt-1", work, T0).held
    step = rpcs.take()
    assert firestore_store.renew("run-1", "attempt-1", LEASE, T0) is not None
    renewal = rpcs.take()
    print(f"firestore transactional step: step {step}, renewal after it {renewal}")
    assert step == ["begin_transaction", "batch_get_documents", "commit"]
    assert renewal == ["commit"]
    assert count("a") == 1


def test_a_spanner_step_whose_commit_answer_was_lost_is_recognised_from_the_record(
    spanner_store: SpannerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    write, count = _spanner_effects(spanner_store)
    spanner_store.claim(claim_request(), T0)
    original = SpannerTransaction.commit

    def commit_then_fail(self: SpannerTransaction, *args: Any, **kwargs: Any) -> Any:
        original(self, *args, **kwargs)  # type: ignore[no-untyped-call]
        raise api.DeadlineExceeded("the answer was lost")

    monkeypatch.setattr(SpannerTransaction, "commit", commit_then_fail)
    outcome = spanner_store.record_step_in_transaction("run-1", "attempt-1", _step(write, "a"), T0)
    monkeypatch.undo()
    assert (outcome.held, outcome.result_json) == (True, "1")
    assert count("a") == 1


def test_a_spanner_step_whose_commit_fails_is_store_unavailable_and_keeps_nothing(
    spanner_store: SpannerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    write, count = _spanner_effects(spanner_store)
    spanner_store.claim(claim_request(), T0)

    def unreachable(self: SpannerTransaction, *args: Any, **kwargs: Any) -> Any:
        raise api.ServiceUnavailable("connection refused")

    monkeypatch.setattr(SpannerTransaction, "commit", unreachable)
    with pytest.raises(StoreUnavailable):
        spanner_store.record_step_in_transaction("run-1", "attempt-1", _step(write, "a"), T0)
    monkeypatch.undo()
    assert count("a") == 0
    record = spanner_store.get("run-1")
    assert record is not None and steps.steps_of(record) == {}


# --- Through the real app ------------------------------------------------------------------


def _post(app: Any, retry: int = 0) -> Any:
    return app.test_client().post(
        "/tasks/h", headers=task_headers(task="t-1", retry=retry, execution=retry), data=b"{}"
    )


def _run_id() -> str:
    return DeliveryIdentity(Kind.TASK, "h", queue="default", task_name="t-1").run_id


def _log_fields(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [getattr(record, "tasklease", {}) for record in caplog.records]


def test_a_spanner_step_aborted_by_a_renewal_runs_again_and_the_log_line_counts_its_tries(
    spanner_store: SpannerStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Another client's read-write transaction on the run while the step's is open: the
    emulator runs one at a time and discards the step's (as Spanner aborts one of two), so
    the step's function runs twice in one attempt; only the second try's write is kept."""
    write, count = _spanner_effects(spanner_store)
    other = SpannerStore(spanner_store.database_path)
    router = Router()
    calls: list[Any] = []

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> int:
        def debit(tx: Any) -> int:
            assert tx is ctx.transaction
            calls.append(tx)
            write(tx, "debit")
            if len(calls) == 1:  # What the attempt's lease keeper may do at any time.
                other.renew(ctx.run_id, ctx.attempt_id, LEASE, datetime.now(UTC))
            return len(calls)

        tries: int = ctx.step("debit", debit, transactional=True)
        return tries

    app = create_app(router, store=spanner_store, auth="none")
    try:
        with caplog.at_level(logging.INFO, logger="tasklease"):
            answer = _post(app)
    finally:
        other.close()
    assert answer.headers["X-Tasklease-Outcome"] == "processed", answer.get_data(as_text=True)
    assert json.loads(answer.data)["result"] == len(calls) > 1
    assert count("debit") == 1  # The aborted try's write was not kept.
    line = next(f for f in _log_fields(caplog) if "steps_run" in f)
    assert (line["steps_run"], line["transaction_tries"]) == (1, len(calls))
    record = spanner_store.get(_run_id())
    assert record is not None and record.status is RunStatus.COMPLETED
    assert steps.steps_of(record)["debit"].result == len(calls)


def test_a_firestore_step_reads_then_writes_through_the_runs_transaction(
    firestore_store: FirestoreStore,
) -> None:
    """A transfer as one step: both balances read through ``ctx.transaction`` (after the
    store's read of the run), both written; a retry after the handler fails later replays
    the step from its record and moves nothing again."""
    accounts = firestore_store.client.collection(f"accounts_{uuid.uuid4().hex[:8]}")
    for name in ("alice", "bob"):
        accounts.document(name).set({"balance": 100})
    router = Router()
    calls: list[int] = []

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> int:
        @ctx.step("transfer", transactional=True)
        def moved(tx: Any) -> int:
            calls.append(ctx.attempt)
            alice, bob = accounts.document("alice"), accounts.document("bob")
            balances = {ref.id: ref.get(transaction=tx).get("balance") for ref in (alice, bob)}
            tx.update(alice, {"balance": balances["alice"] - 30})
            tx.update(bob, {"balance": balances["bob"] + 30})
            return 30

        if ctx.attempt == 1:
            raise RuntimeError("after the step")
        return moved

    app = create_app(router, store=firestore_store, auth="none")
    assert _post(app).headers["X-Tasklease-Outcome"] == "released"
    answer = _post(app, retry=1)
    assert answer.headers["X-Tasklease-Outcome"] == "processed"
    assert json.loads(answer.data)["result"] == 30
    assert calls == [1]  # Replayed from the record on the retry.
    assert {doc.id: doc.get("balance") for doc in accounts.stream()} == {"alice": 70, "bob": 130}


def test_a_firestore_step_of_a_taken_over_attempt_keeps_nothing(
    firestore_store: FirestoreStore,
) -> None:
    """The run taken over between the attempt's claim and its step: the step's transaction
    reads the run first, finds another attempt's claim and writes nothing."""
    write, count = _firestore_effects(firestore_store)
    router = Router()

    @router.task("h")
    def h(payload: Any, ctx: TaskContext) -> int:
        firestore_store.release(ctx.run_id, ctx.attempt_id, "taken over", T0)

        def debit(tx: Any) -> int:
            write(tx, "debit")
            return 1

        result: int = ctx.step("debit", debit, transactional=True)
        return result

    answer = _post(create_app(router, store=firestore_store, auth="none"))
    assert answer.headers["X-Tasklease-Outcome"] == "lost_claim", answer.get_data(as_text=True)
    assert "transactional step 'debit'" in answer.get_data(as_text=True)  # Rolled back.
    assert count("debit") == 0
