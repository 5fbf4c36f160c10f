"""SpannerStore: the shared contracts against Google's Spanner emulator, its RPCs, its
schema, and a database that stops answering."""

from __future__ import annotations

import functools
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from google.api_core import exceptions as api
from google.cloud import spanner
from google.cloud.spanner_v1.batch import Batch

from tasklease.errors import ConfigurationError, StoreUnavailable
from tasklease.testing.contract_support import EXPIRED, LEASE, lock_request
from tasklease.testing.fan_in_contract import FanInContract, FanInCrossProcess, family
from tasklease.testing.lock_contract import LockContract
from tasklease.testing.operations_contract import OperationsContract
from tasklease.testing.store_contract import CrossProcessContract, StoreContract
from tasklease.testing.tally_contract import TallyContract
from tasklease.worker import Router, create_app
from tasklease.worker.core.records import RunStatus, Verdict
from tasklease.worker.stores import SpannerStore, store_from_url
from tasklease.worker.stores.spanner import schema
from tests.support.helpers import T0, claim_request, task_headers
from tests.support.spanner import Emulator, RpcCounter
from tests.support.stores import ReceiptWorker, closed_after_the_test


def new_store(database: str, **options: Any) -> SpannerStore:
    return closed_after_the_test(SpannerStore(database, **options))


class TestSpannerStore(
    StoreContract,
    LockContract,
    FanInContract,
    OperationsContract,
    CrossProcessContract,
    FanInCrossProcess,
    TallyContract,
):
    @pytest.fixture
    def store(self, spanner_database: str) -> SpannerStore:
        return new_store(spanner_database)

    @pytest.fixture
    def store_factory(self, spanner_database: str) -> functools.partial[SpannerStore]:
        return functools.partial(SpannerStore, spanner_database)


@pytest.fixture
def counted(spanner_database: str) -> tuple[SpannerStore, RpcCounter]:
    """A store whose schema is ready and session made, its RPCs counted from here on."""
    store = new_store(spanner_database)
    store.get("warm-up")
    return store, RpcCounter(store.database)


def test_delivery_rpcs_three_per_first_execution_one_per_retried_duplicate(
    counted: tuple[SpannerStore, RpcCounter],
) -> None:
    store, rpcs = counted
    router = Router()
    router.task("send_receipt")(lambda payload, ctx: {"ok": True})
    app = create_app(router, store=store, auth="none")

    def deliver(retry: int) -> str:
        headers = task_headers(retry=retry, execution=retry)
        response = app.test_client().post("/tasks/send_receipt", headers=headers, data=b"{}")
        return str(response.headers["X-Tasklease-Outcome"])

    assert deliver(0) == "processed"
    # The insert (a single-use Commit), then the completion's transaction: read, Commit.
    assert rpcs.take() == ["commit", "streaming_read", "commit"]
    assert deliver(1) == "duplicate"
    assert rpcs.take() == ["streaming_read"]  # A retry reads first: one strong read.
    assert deliver(0) == "duplicate"  # Not marked as a retry: the refused insert, one read.
    assert rpcs.take() == ["commit", "streaming_read"]


def test_a_takeover_reads_then_decides_again_in_a_transaction(
    counted: tuple[SpannerStore, RpcCounter],
) -> None:
    store, rpcs = counted
    store.claim(claim_request(), T0)
    rpcs.take()
    claim = store.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)
    assert (claim.verdict, claim.took_over_from) == (Verdict.CLAIMED, "attempt-1")
    assert rpcs.take() == ["commit", "streaming_read", "streaming_read", "commit"]


def test_renewal_and_a_lock_change_are_one_transaction_each(
    counted: tuple[SpannerStore, RpcCounter],
) -> None:
    store, rpcs = counted
    store.claim(claim_request(), T0)
    rpcs.take()
    assert store.renew("run-1", "attempt-1", LEASE, T0 + LEASE / 2)
    assert rpcs.take() == ["streaming_read", "commit"]
    assert store.acquire_lock(lock_request(), T0).acquired
    assert rpcs.take() == ["streaming_read", "commit"]


def test_a_fan_in_childs_finish_is_one_transaction_of_three_rpcs(
    counted: tuple[SpannerStore, RpcCounter],
) -> None:
    store, rpcs = counted
    first, second = family(2)
    for member in (first, second):
        store.claim(claim_request(f"child-{member.key}", f"a1-{member.key}"), T0)
    rpcs.take()
    # The run's row, the join with the child's entry in one query, the Commit.
    opening = store.complete_member(
        first, "child-k000", "a1-k000", "1", T0, keep_for=timedelta(days=7)
    )
    assert opening is not None and not opening.closed
    assert rpcs.take() == ["streaming_read", "execute_streaming_sql", "commit"]
    closing = store.complete_member(
        second, "child-k001", "a1-k001", "2", T0, keep_for=timedelta(days=7)
    )
    assert closing is not None and closing.closed
    assert rpcs.take() == ["streaming_read", "execute_streaming_sql", "commit"]


def test_an_aborted_transaction_runs_again_reading_the_row_and_the_clock_afresh(
    spanner_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = new_store(spanner_database)
    store.claim(claim_request(), T0)
    database = store.database
    original = database.run_in_transaction
    runs: list[str] = []

    def abort_the_first(work: Any, **options: Any) -> Any:
        def aborted(transaction: Any) -> Any:
            work(transaction)  # Decided and buffered its write; the commit never happens.
            raise api.Aborted("contention", errors=[None])  # As from gRPC: a cause.

        runs.append("aborted" if not runs else "committed")
        return original(aborted if len(runs) == 1 else work, **options)

    monkeypatch.setattr(database, "run_in_transaction", abort_the_first)
    readings: list[datetime] = []

    def clock() -> datetime:
        readings.append(T0 + LEASE / (2 + len(readings)))  # Each reading a new value.
        return readings[-1]

    assert store.renew("run-1", "attempt-1", LEASE, clock) == readings[-1] + LEASE
    assert (runs, len(readings)) == (["aborted", "committed"], 2)
    assert store.get("run-1").lease_expires == readings[-1] + LEASE  # type: ignore[union-attr]


def test_an_aborted_fan_in_count_runs_again_and_counts_the_child_once(
    spanner_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = new_store(spanner_database)
    first, _ = family(2)
    store.claim(claim_request("child-k000", "a1-k000"), T0)
    database = store.database
    original = database.run_in_transaction
    tries: list[str] = []

    def abort_the_first(work: Any, **options: Any) -> Any:
        def aborted(transaction: Any) -> Any:
            work(transaction)  # Counted and buffered the join and its entry; never committed.
            raise api.Aborted("contention", errors=[None])

        tries.append("aborted" if not tries else "committed")
        return original(aborted if len(tries) == 1 else work, **options)

    monkeypatch.setattr(database, "run_in_transaction", abort_the_first)
    progress = store.complete_member(
        first, "child-k000", "a1-k000", "1", T0, keep_for=timedelta(days=7)
    )
    assert progress is not None and not progress.closed
    assert tries == ["aborted", "committed"]
    join = store.get_fan_in(first.join_id)
    assert join is not None and (join.done, join.expected) == (1, 2)


def test_a_claim_whose_insert_landed_unseen_is_recognised_by_attempt_id(
    spanner_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = new_store(spanner_database)
    original = Batch.commit

    def commit_then_fail(self: Batch, *args: Any, **kwargs: Any) -> Any:
        original(self, *args, **kwargs)  # type: ignore[no-untyped-call]
        raise api.ServiceUnavailable("the insert landed, its answer was lost")

    monkeypatch.setattr(Batch, "commit", commit_then_fail)
    claim = store.claim(claim_request(), T0)
    assert (claim.verdict, claim.record.attempt_id) == (Verdict.CLAIMED, "attempt-1")
    monkeypatch.setattr(Batch, "commit", original)
    assert store.complete("run-1", "attempt-1", '"done"', T0)


def test_a_claim_retried_by_the_client_after_it_landed_is_still_ours(
    spanner_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = new_store(spanner_database)
    original = Batch.commit

    def landed_then_refused(self: Batch, *args: Any, **kwargs: Any) -> Any:
        original(self, *args, **kwargs)  # type: ignore[no-untyped-call]
        raise api.AlreadyExists("row exists: the client's retry of our own landed insert")

    monkeypatch.setattr(Batch, "commit", landed_then_refused)
    claim = store.claim(claim_request(), T0)
    assert (claim.verdict, claim.record.attempt_id) == (Verdict.CLAIMED, "attempt-1")


def test_schema_creation_is_idempotent_and_includes_the_row_deletion_policies(
    spanner_database: str,
) -> None:
    first, second = new_store(spanner_database), new_store(spanner_database)
    first.create_schema()
    second.create_schema()  # Everything is there: nothing to do, no error.
    assert second.get("absent") is None
    sql = (
        "SELECT table_name, row_deletion_policy_expression FROM information_schema.tables "
        "WHERE table_schema = '' ORDER BY table_name"
    )
    with first.database.snapshot() as snapshot:
        policies = [tuple(row) for row in snapshot.execute_sql(sql)]
    assert policies == [
        ("tasklease_runs", "OLDER_THAN(expire_at, INTERVAL 0 DAY)"),
        ("tasklease_runs_fan_in_entries", None),  # Deleted with their join (interleaved).
        ("tasklease_runs_fan_ins", "OLDER_THAN(expire_at, INTERVAL 0 DAY)"),
        ("tasklease_runs_locks", "OLDER_THAN(lapses_at, INTERVAL 0 DAY)"),
        ("tasklease_runs_tally", "OLDER_THAN(minute, INTERVAL 1 DAY)"),
    ]
    assert schema.objects("tasklease_runs") <= set(_names(first))


def _names(store: SpannerStore) -> list[str]:
    sql = (
        "SELECT table_name FROM information_schema.tables WHERE table_schema = '' "
        "UNION ALL SELECT index_name FROM information_schema.indexes WHERE table_schema = ''"
    )
    with store.database.snapshot() as snapshot:
        return [row[0] for row in snapshot.execute_sql(sql)]


def test_a_database_made_before_fan_ins_gains_their_tables_on_first_use(
    spanner_database: str,
) -> None:
    before = [
        statement
        for statement in schema.ddl("tasklease_runs")
        if statement not in schema.fan_in_ddl("tasklease_runs")
    ]
    _, project, _, instance, _, database_id = spanner_database.split("/")
    client = spanner.Client(project=project)
    database = client.instance(instance).database(database_id)  # type: ignore[no-untyped-call]
    database.update_ddl(before).result(120)
    store = new_store(spanner_database)
    (member,) = family(1)
    store.claim(claim_request("child-k000", "a1-k000"), T0)
    progress = store.complete_member(
        member, "child-k000", "a1-k000", "1", T0, keep_for=timedelta(days=7)
    )
    assert progress is not None and progress.closed
    assert [e.key for e in store.fan_in_entries(member.join_id)] == ["k000"]


def test_a_store_told_not_to_create_the_schema_says_what_is_missing(
    spanner_database: str,
) -> None:
    store = new_store(spanner_database, create_schema=False)
    with pytest.raises(StoreUnavailable, match="create_schema"):
        store.get("run-1")
    store.create_schema()
    assert store.get("run-1") is None


def test_each_write_carries_spanners_commit_timestamp(spanner_database: str) -> None:
    store = new_store(spanner_database)
    before = time.time()
    store.claim(claim_request(), T0)
    with store.database.snapshot() as snapshot:
        rows = list(snapshot.execute_sql("SELECT claimed_at, committed_at FROM tasklease_runs"))
    (claimed_at, committed_at) = rows[0]
    assert claimed_at == T0  # The rules' time, from the claiming instance's clock.
    assert committed_at.timestamp() >= before - 1  # Spanner's own time of the write.


def test_store_url_selects_spanner(spanner_emulator: Emulator) -> None:
    store = store_from_url(
        "spanner://projects/p/instances/i/databases/d?table=my_runs&call_timeout=2.5"
    )
    assert isinstance(store, SpannerStore)
    assert (store.database_path, store.table, store.lock_table) == (
        "projects/p/instances/i/databases/d",
        "my_runs",
        "my_runs_locks",
    )
    with pytest.raises(ConfigurationError, match="unknown options"):
        store_from_url("spanner://projects/p/instances/i/databases/d?collection=x")
    with pytest.raises(ConfigurationError, match="projects/P/instances/I/databases/D"):
        store_from_url("spanner://projects/p/databases/d")
    with pytest.raises(ConfigurationError, match="table"):
        SpannerStore("projects/p/instances/i/databases/d", table="runs; DROP TABLE x")


def test_a_frozen_emulator_answers_store_unavailable_within_the_call_timeout(
    spanner_emulator: Emulator, spanner_database: str
) -> None:
    store = new_store(spanner_database, call_timeout=1.0)
    store.claim(claim_request(), T0)
    (member,) = family(1)
    spanner_emulator.freeze()
    try:
        for call in (
            lambda: store.claim(claim_request("run-2", "attempt-2"), T0),
            lambda: store.complete("run-1", "attempt-1", None, T0),
            lambda: store.complete_member(member, "run-1", "attempt-1", None, T0),
            lambda: store.get("run-1"),
        ):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                call()
            # Bounded, not a hang: the deadline is 1 s; generous for a loaded machine.
            assert time.monotonic() - started < 15
    finally:
        spanner_emulator.thaw()
    assert store.get("run-1").status is RunStatus.IN_PROGRESS  # type: ignore[union-attr]


def test_worker_runs_on_spanner_through_the_app(spanner_database: str) -> None:
    worker = ReceiptWorker(new_store(spanner_database))
    assert worker.outcomes(3) == ["processed", "duplicate", "duplicate"]
    assert len(worker.runs) == 1
