"""Transactional completion on the Google stores, against Google's emulators: the handler's
writes through the store's native transaction and the run's completion record commit
together, or neither does.

:class:`TransactionContract` is written store-neutrally (hooks ``write_effect`` and
``count_effects``, a ``store`` fixture), to join the SQL stores' shared contract.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from google.api_core import exceptions as api
from google.cloud import firestore
from google.cloud.firestore_v1.transaction import Transaction as FirestoreTransaction
from google.cloud.spanner_v1.transaction import Transaction as SpannerTransaction

from tasklease.errors import StoreUnavailable
from tasklease.testing.contract_support import EXPIRED, LEASE, T0, claim_request
from tasklease.worker.core import decisions
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores import FirestoreStore, SpannerStore, TransactionalStore
from tasklease.worker.stores.firestore.codec import decode_run, encode_run
from tests.faults.private_firestore import private_firestore
from tests.support.firestore import PROJECT, RpcCounter, unique_collection
from tests.support.spanner import Emulator
from tests.support.spanner import RpcCounter as SpannerRpcCounter

# The lease as the concurrent renewal of the contention test writes it.
RENEWED = T0 + LEASE / 4 + LEASE


class HandlerBug(ValueError):
    """What a handler raises in these tests: a ValueError, which the stores' own error
    mapping would take for a database failure were it not kept apart."""


class TransactionContract:
    """What every :class:`TransactionalStore` promises for ``complete_in_transaction``."""

    def write_effect(self, tx: Any, key: str) -> None:
        """Apply one (not idempotent) effect for ``key`` through the native transaction."""
        raise NotImplementedError

    def count_effects(self, key: str) -> int:
        """How many effects for ``key`` are committed."""
        raise NotImplementedError

    def contention(self, store: Any, run_id: str, attempt_id: str) -> Any:
        """A context manager giving ``provoke()``: called inside the transaction, it makes
        another client renew the run's lease to ``RENEWED`` (as the attempt's own lease
        keeper does) in a way that aborts the transaction in progress; on exit, that
        renewal has committed."""
        raise NotImplementedError

    def lose_commit_answer(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make the next commit land, then fail as if its answer was lost on the way."""
        raise NotImplementedError

    def work(self, key: str, result: str | None = '{"ok": true}') -> Any:
        def work(tx: Any) -> str | None:
            self.write_effect(tx, key)
            return result

        return work

    def test_the_handlers_writes_and_the_completion_commit_together(self, store: Any) -> None:
        store.claim(claim_request(), T0)
        outcome = store.complete_in_transaction(
            "run-1", "attempt-1", self.work("a"), T0 + LEASE / 2, keep_for=timedelta(days=30)
        )
        assert (outcome.held, outcome.result_json, outcome.tries) == (True, '{"ok": true}', 1)
        assert self.count_effects("a") == 1
        record = store.get("run-1")
        assert (record.status, record.result_json) == (RunStatus.COMPLETED, '{"ok": true}')
        assert record.finished_at == T0 + LEASE / 2
        assert record.expire_at >= T0 + LEASE / 2 + timedelta(days=30)  # Kept keep_for.
        assert isinstance(store, TransactionalStore) and store.transaction_reruns

    def test_a_handler_that_raises_keeps_nothing_and_the_claim_stays_held(self, store: Any) -> None:
        store.claim(claim_request(), T0)

        def work(tx: Any) -> str | None:
            self.write_effect(tx, "b")
            raise HandlerBug("the handler's own error")

        with pytest.raises(HandlerBug, match="own error"):
            store.complete_in_transaction("run-1", "attempt-1", work, T0 + LEASE / 2)
        assert self.count_effects("b") == 0
        record = store.get("run-1")
        assert (record.status, record.attempt_id) == (RunStatus.IN_PROGRESS, "attempt-1")
        assert store.complete("run-1", "attempt-1", None, T0 + LEASE / 2)  # Still its claim.

    def test_a_claim_taken_over_keeps_nothing_and_is_reported_not_held(self, store: Any) -> None:
        store.claim(claim_request(), T0)
        lapsed = T0 + EXPIRED
        store.claim(claim_request(attempt_id="attempt-2"), lambda: lapsed)  # Taken over.
        outcome = store.complete_in_transaction(
            "run-1", "attempt-1", self.work("c"), lambda: lapsed
        )
        assert (outcome.held, outcome.result_json) == (False, None)
        assert self.count_effects("c") == 0
        record = store.get("run-1")
        assert (record.status, record.attempt_id) == (RunStatus.IN_PROGRESS, "attempt-2")

    def test_a_run_never_claimed_is_not_held_and_keeps_nothing(self, store: Any) -> None:
        outcome = store.complete_in_transaction("run-9", "attempt-1", self.work("d"), T0)
        assert not outcome.held
        assert self.count_effects("d") == 0
        assert store.get("run-9") is None

    def test_a_contended_transaction_runs_again_and_counts_its_tries(self, store: Any) -> None:
        store.claim(claim_request(), T0)
        calls: list[int] = []
        readings: list[datetime] = []

        def clock() -> datetime:
            readings.append(T0 + LEASE / 2 + timedelta(seconds=len(readings)))
            return readings[-1]

        with self.contention(store, "run-1", "attempt-1") as provoke:

            def work(tx: Any) -> str | None:
                calls.append(len(calls) + 1)
                self.write_effect(tx, "e")
                if len(calls) == 1:
                    provoke()
                return f'"try {len(calls)}"'

            outcome = store.complete_in_transaction("run-1", "attempt-1", work, clock)
        assert outcome.held
        assert outcome.tries == len(calls) > 1
        assert outcome.result_json == f'"try {len(calls)}"'
        assert self.count_effects("e") == 1  # The aborted try's write was not kept.
        record = store.get("run-1")
        assert (record.status, record.result_json) == (RunStatus.COMPLETED, outcome.result_json)
        # Completed from the record as renewed by the concurrent write, not the stale one.
        assert record.lease_expires == RENEWED
        assert record.finished_at == readings[-1]  # The time read in the committed try.

    # Tries of a finish called again: 0 where the run is read before the handler runs; 1 on
    # Spanner, which reads it after (its transaction locks nothing while the handler runs).
    tries_of_a_finish_called_again = 0

    def test_a_finish_called_again_recognises_its_own_commit(self, store: Any) -> None:
        store.claim(claim_request(), T0)
        first = store.complete_in_transaction("run-1", "attempt-1", self.work("f"), T0)
        again = store.complete_in_transaction("run-1", "attempt-1", self.work("f", "x"), T0)
        assert (first.held, again.held) == (True, True)
        assert again.result_json == first.result_json == '{"ok": true}'
        assert again.tries == self.tries_of_a_finish_called_again
        assert self.count_effects("f") == 1  # Run again or not, its writes were not kept.

    def test_a_commit_whose_answer_was_lost_is_recognised_from_the_record(
        self, store: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store.claim(claim_request(), T0)
        self.lose_commit_answer(monkeypatch)
        outcome = store.complete_in_transaction("run-1", "attempt-1", self.work("g"), T0)
        assert (outcome.held, outcome.result_json) == (True, '{"ok": true}')
        assert self.count_effects("g") == 1
        assert store.get("run-1").status is RunStatus.COMPLETED

    def test_a_failed_commit_answers_store_unavailable_and_keeps_nothing(
        self, store: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store.claim(claim_request(), T0)
        self.fail_commit(monkeypatch)
        with pytest.raises(StoreUnavailable):
            store.complete_in_transaction("run-1", "attempt-1", self.work("h"), T0)
        monkeypatch.undo()
        assert self.count_effects("h") == 0
        assert store.get("run-1").status is RunStatus.IN_PROGRESS

    def fail_commit(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make every commit fail unsent, as when the database is unreachable."""
        raise NotImplementedError


# --- Spanner -------------------------------------------------------------------------------

EFFECTS_DDL = "CREATE TABLE effects (id STRING(36) NOT NULL, key STRING(100)) PRIMARY KEY (id)"


class TestSpannerTransactions(TransactionContract):
    tries_of_a_finish_called_again = 1

    @pytest.fixture
    def store(self, spanner_database: str) -> Iterator[SpannerStore]:
        store = SpannerStore(spanner_database, call_timeout=5.0)
        store.database.update_ddl([EFFECTS_DDL]).result(60)
        self._store = store
        yield store
        store.close()

    def write_effect(self, tx: Any, key: str) -> None:
        tx.execute_update(
            "INSERT INTO effects (id, key) VALUES (@id, @key)",
            params={"id": str(uuid.uuid4()), "key": key},
            param_types={"id": _string(), "key": _string()},
        )

    def count_effects(self, key: str) -> int:
        with self._store.database.snapshot() as snapshot:
            rows = snapshot.execute_sql(
                "SELECT COUNT(*) FROM effects WHERE key = @key",
                params={"key": key},
                param_types={"key": _string()},
            )
            return int(next(iter(rows))[0])

    @contextmanager
    def contention(self, store: Any, run_id: str, attempt_id: str) -> Iterator[Any]:
        """The renewal in a read-write transaction of another client, run at once: the
        emulator runs one read-write transaction at a time and discards the one in
        progress for it (see spanner_calls), as real Spanner aborts one of two."""
        other = SpannerStore(store.database_path)

        def provoke() -> None:
            assert other.renew(run_id, attempt_id, LEASE, T0 + LEASE / 4) == RENEWED

        try:
            yield provoke
        finally:
            other.close()

    def lose_commit_answer(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = SpannerTransaction.commit

        def commit_then_fail(self: SpannerTransaction, *args: Any, **kwargs: Any) -> Any:
            original(self, *args, **kwargs)  # type: ignore[no-untyped-call]
            raise api.DeadlineExceeded("the answer was lost")

        monkeypatch.setattr(SpannerTransaction, "commit", commit_then_fail)

    def fail_commit(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def unreachable(self: SpannerTransaction, *args: Any, **kwargs: Any) -> Any:
            raise api.ServiceUnavailable("connection refused")

        monkeypatch.setattr(SpannerTransaction, "commit", unreachable)


def test_a_spanner_handler_slower_than_the_call_timeout_still_runs_again_on_contention(
    spanner_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's call_timeout bounds each RPC, not the handler's work: a try that outlasts
    it and is then aborted still runs again (it once answered "too much contention")."""
    store = SpannerStore(spanner_database, call_timeout=1.0)
    try:
        store.database.update_ddl([EFFECTS_DDL]).result(60)
        contract = TestSpannerTransactions()
        contract._store = store
        store.claim(claim_request(), T0)
        original = store.database.run_in_transaction
        tries: list[str] = []

        def abort_the_first(work: Any, **options: Any) -> Any:
            def slow_then_aborted(transaction: Any) -> Any:
                work(transaction)
                time.sleep(1.3)  # Longer than the call_timeout, on purpose.
                raise api.Aborted("contention", errors=[None])

            tries.append("aborted" if not tries else "committed")
            return original(slow_then_aborted if len(tries) == 1 else work, **options)

        monkeypatch.setattr(store.database, "run_in_transaction", abort_the_first)
        outcome = store.complete_in_transaction("run-1", "attempt-1", contract.work("s"), T0)
        assert (outcome.held, outcome.tries, tries) == (True, 2, ["aborted", "committed"])
        assert contract.count_effects("s") == 1
    finally:
        store.close()


def test_a_frozen_spanner_answers_store_unavailable_and_keeps_nothing(
    spanner_emulator: Emulator, spanner_database: str
) -> None:
    """Every RPC of the transaction has the store's deadline, and the read back of the record
    after the failure too: the call ends, and the thawed database shows nothing kept. The
    handler only buffers a mutation, so the store's own read is the first RPC to fail (a
    statement of the handler's failing is the handler's error, raised as it is)."""
    # Set up with the default deadline (a loaded machine slows the emulator's DDL); only
    # the calls made during the freeze need the short one.
    reader = SpannerStore(spanner_database)
    reader.database.update_ddl([EFFECTS_DDL]).result(60)
    reader.claim(claim_request(), T0)
    store = SpannerStore(spanner_database, call_timeout=1.0)
    try:
        contract = TestSpannerTransactions()
        assert store.database is not None  # Connected, its schema found, before the freeze.
        spanner_emulator.freeze()
        try:
            with pytest.raises(StoreUnavailable):
                store.complete_in_transaction("run-1", "attempt-1", _buffered_effect("z"), T0)
        finally:
            spanner_emulator.thaw()
        # Read back with the default deadline too: the thawed emulator works through what
        # queued while it was stopped.
        contract._store = reader
        assert contract.count_effects("z") == 0
        record = reader.get("run-1")
        assert record is not None and record.status is RunStatus.IN_PROGRESS
    finally:
        store.close()
        reader.close()


def _buffered_effect(key: str) -> Any:
    """Work writing one effect as a mutation, sent with the Commit (no RPC of its own)."""

    def work(tx: Any) -> str | None:
        tx.insert("effects", ["id", "key"], [[str(uuid.uuid4()), key]])
        return None

    return work


def _string() -> Any:
    from google.cloud import spanner  # noqa: PLC0415 - the optional extra, on use only.

    return spanner.param_types.STRING


def test_spanner_rpcs_of_a_transactional_first_execution(spanner_database: str) -> None:
    """The claim (one Commit), then one transaction: the handler's own DML (beginning it
    inline), the row's read, the Commit. Printed for BENCHMARKS.md; no goal asserted beyond
    what the store's docstring states."""
    store = SpannerStore(spanner_database)
    try:
        store.database.update_ddl([EFFECTS_DDL]).result(60)
        store.get("warm-up")
        rpcs = SpannerRpcCounter(store.database)
        store.claim(claim_request(), T0)
        claim = rpcs.take()
        contract = TestSpannerTransactions()
        contract._store = store
        outcome = store.complete_in_transaction("run-1", "attempt-1", contract.work("r"), T0)
        completion = rpcs.take()
        print(f"spanner transactional first execution: claim {claim}, completion {completion}")
        assert outcome.held
        assert claim == ["commit"]
        assert completion == ["execute_sql", "streaming_read", "commit"]
    finally:
        store.close()


# --- Firestore -----------------------------------------------------------------------------


class TestFirestoreTransactions(TransactionContract):
    @pytest.fixture
    def store(self, firestore_host: str | None) -> Iterator[FirestoreStore]:
        store = FirestoreStore.from_options(collection=unique_collection(), project=PROJECT)
        self._store = store
        self._effects = f"effects_{uuid.uuid4().hex[:8]}"
        yield store
        store.close()

    def write_effect(self, tx: Any, key: str) -> None:
        ref = self._store.client.collection(self._effects).document(key)
        tx.set(ref, {"n": firestore.Increment(1)}, merge=True)

    def count_effects(self, key: str) -> int:
        snapshot = self._store.client.collection(self._effects).document(key).get()
        return int(snapshot.get("n")) if snapshot.exists else 0

    @contextmanager
    def contention(self, store: Any, run_id: str, attempt_id: str) -> Iterator[Any]:
        """The renewal in another client's transaction, which read the run (locking it)
        before the transaction under test began: that one's Commit then waits for the lock
        and is aborted (the emulator gives up waiting after about 2 s; Firestore's
        pessimistic transactions abort the younger of two). The renewal commits as the
        aborted transaction begins again, holding no lock then."""
        client = firestore.Client(project=PROJECT)
        ref = client.collection(store.collection).document(run_id)
        older = client.transaction()
        older._begin()
        record = decode_run(run_id, ref.get(transaction=older).to_dict())
        begins: list[FirestoreTransaction] = []
        original = FirestoreTransaction._begin

        def begin(transaction: FirestoreTransaction, **options: Any) -> None:
            begins.append(transaction)
            if len(begins) == 2:  # The transaction under test, run again after its abort.
                older.set(ref, encode_run(decisions.renewed(record, RENEWED)))
                older._commit()
            original(transaction, **options)

        provoked: list[bool] = []
        try:
            with mock.patch.object(FirestoreTransaction, "_begin", begin):
                yield lambda: provoked.append(True)  # The conflict is set up already.
        finally:
            client.close()  # type: ignore[no-untyped-call]
        assert provoked == [True]

    def lose_commit_answer(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = FirestoreTransaction._commit

        def commit_then_fail(self: FirestoreTransaction) -> Any:
            original(self)
            raise api.DeadlineExceeded("the answer was lost")

        monkeypatch.setattr(FirestoreTransaction, "_commit", commit_then_fail)

    def fail_commit(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def unreachable(self: FirestoreTransaction) -> Any:
            raise api.ServiceUnavailable("connection refused")

        monkeypatch.setattr(FirestoreTransaction, "_commit", unreachable)


@pytest.fixture
def ledger(firestore_host: str | None) -> Iterator[tuple[FirestoreStore, Any]]:
    """A Firestore store and a collection of two accounts holding 100 each."""
    store = FirestoreStore.from_options(collection=unique_collection(), project=PROJECT)
    accounts = store.client.collection(f"accounts_{uuid.uuid4().hex[:8]}")
    for name in ("alice", "bob"):
        accounts.document(name).set({"balance": 100})
    yield store, accounts
    store.close()


def test_a_firestore_handler_reads_before_it_writes_in_the_same_transaction(
    ledger: tuple[FirestoreStore, Any],
) -> None:
    """A transfer: the handler reads both balances through the transaction (after the
    store's read of the run), then writes both; the record commits with them."""
    store, accounts = ledger
    store.claim(claim_request(), T0)

    def transfer(tx: Any) -> str | None:
        alice, bob = (accounts.document(name) for name in ("alice", "bob"))
        balances = {ref.id: ref.get(transaction=tx).get("balance") for ref in (alice, bob)}
        tx.update(alice, {"balance": balances["alice"] - 30})
        tx.update(bob, {"balance": balances["bob"] + 30})
        return '{"moved": 30}'

    assert store.complete_in_transaction("run-1", "attempt-1", transfer, T0).held
    balances = {doc.id: doc.get("balance") for doc in accounts.stream()}
    assert balances == {"alice": 70, "bob": 130}
    record = store.get("run-1")
    assert record is not None and record.result_json == '{"moved": 30}'


def test_a_firestore_handler_reading_after_a_write_fails_and_keeps_nothing(
    ledger: tuple[FirestoreStore, Any],
) -> None:
    """Firestore wants a transaction's reads before its writes: the client refuses a read
    after one, which fails the handler (its own error) and keeps nothing."""
    store, accounts = ledger
    store.claim(claim_request(), T0)

    def read_after_write(tx: Any) -> str | None:
        tx.update(accounts.document("alice"), {"balance": 0})
        accounts.document("bob").get(transaction=tx)
        return None

    with pytest.raises(firestore.ReadAfterWriteError):
        store.complete_in_transaction("run-1", "attempt-1", read_after_write, T0)
    assert accounts.document("alice").get().get("balance") == 100
    record = store.get("run-1")
    assert record is not None and record.status is RunStatus.IN_PROGRESS


def test_a_frozen_firestore_answers_store_unavailable_and_keeps_nothing() -> None:
    """The transaction's own RPCs (BeginTransaction, Commit, Rollback) get the store's
    deadline, not the client's 60 s each: the call ends, and the thawed database shows
    nothing kept. On an emulator of the test's own, so freezing it disturbs no other test."""
    with (
        private_firestore() as emulator,
        mock.patch.dict(os.environ, {"FIRESTORE_EMULATOR_HOST": emulator.host}),
    ):
        collection = unique_collection()
        warm = FirestoreStore.from_options(collection=collection, project=PROJECT)
        store = FirestoreStore.from_options(
            collection=collection, project=PROJECT, call_timeout=1.0
        )
        contract = TestFirestoreTransactions()
        contract._store, contract._effects = warm, f"effects_{uuid.uuid4().hex[:8]}"
        try:
            warm.claim(claim_request(), T0)
            store.get("run-1")  # Connected, before the freeze.
            outcome: list[BaseException | None] = []

            def complete() -> None:
                try:
                    store.complete_in_transaction("run-1", "attempt-1", contract.work("z"), T0)
                except BaseException as exc:
                    outcome.append(exc)
                else:
                    outcome.append(None)

            emulator.freeze()
            try:
                caller = threading.Thread(target=complete, daemon=True)
                caller.start()
                caller.join(timeout=30)  # A hang detector: the bound is 1 s per RPC.
                ended_while_frozen = not caller.is_alive()
            finally:
                emulator.thaw()
            caller.join(timeout=120)
            assert ended_while_frozen
            assert len(outcome) == 1 and isinstance(outcome[0], StoreUnavailable), outcome
            assert contract.count_effects("z") == 0
            record = warm.get("run-1")
            assert record is not None and record.status is RunStatus.IN_PROGRESS
        finally:
            store.close()
            warm.close()


def test_firestore_rpcs_of_a_transactional_first_execution(firestore_host: str | None) -> None:
    """The claim (one create), then one transaction: BeginTransaction, the run's read, the
    Commit holding the handler's writes and the record. Printed, for the report."""
    store = FirestoreStore.from_options(collection=unique_collection(), project=PROJECT)
    try:
        contract = TestFirestoreTransactions()
        contract._store, contract._effects = store, f"effects_{uuid.uuid4().hex[:8]}"
        rpcs = RpcCounter(store.client)
        store.claim(claim_request(), T0)
        claim = rpcs.take()
        assert store.complete_in_transaction("run-1", "attempt-1", contract.work("r"), T0).held
        completion = rpcs.take()
        print(f"firestore transactional first execution: claim {claim}, completion {completion}")
        assert claim == ["commit"]
        assert completion == ["begin_transaction", "batch_get_documents", "commit"]
    finally:
        store.close()
