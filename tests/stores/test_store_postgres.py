"""PostgresStore: the contract suites on a private PostgreSQL cluster, and what is its own
(round trips, the server's clock, a frozen and a restarted server, schema migration, purge)."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tasklease.errors import ConfigurationError, StoreUnavailable
from tasklease.testing.contract_support import EXPIRED
from tasklease.testing.fan_in_contract import FanInContract, FanInCrossProcess, family
from tasklease.testing.store_contract import (
    CrossProcessContract,
    LockContract,
    OperationsContract,
    StoreContract,
    TallyContract,
)
from tasklease.worker import Router, create_app
from tasklease.worker.core.fan_in import JOIN_KEEP_FLOOR
from tasklease.worker.core.records import RunStatus, Verdict
from tasklease.worker.stores import store_from_url
from tasklease.worker.stores.postgres.options import Options
from tasklease.worker.stores.postgres.schema import SCHEMA_VERSION, Statements
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support import postgres as postgres_support
from tests.support.helpers import T0, claim_request, task_headers

pytestmark = pytest.mark.service


class TestPostgresStore(
    StoreContract,
    LockContract,
    OperationsContract,
    CrossProcessContract,
    TallyContract,
    FanInContract,
    FanInCrossProcess,
):
    @pytest.fixture
    def store(self, postgres_url: str) -> Iterator[PostgresStore]:
        # The contract passes its own clocks: they are honoured (server_clock off).
        store = PostgresStore.from_url(f"{postgres_url}&server_clock=off")
        yield store
        store.close()

    @pytest.fixture
    def store_factory(self, postgres_url: str) -> functools.partial[PostgresStore]:
        return functools.partial(PostgresStore.from_url, f"{postgres_url}&server_clock=off")


# --- Round trips ---------------------------------------------------------------------


class StatementCounter:
    """Counts the statements the store sends (each an autocommit round trip), by wrapping
    ``psycopg.Connection.execute``, the one call the store sends them through. The pool's
    set-up of a new connection (it measures the server's clock) is not a call's."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements: list[str] = []
        original = psycopg.Connection.execute

        def execute(connection: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if str(query) != CONNECTION_SETUP:  # Once per new pooled connection, not per call.
                self.statements.append(str(query).split()[0].upper())
            return original(connection, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "execute", execute)

    def take(self) -> list[str]:
        taken, self.statements = self.statements, []
        return taken


CONNECTION_SETUP = Statements("x").now


def _warm(store: PostgresStore) -> None:
    """Open the pool and migrate the schema, so counts start from a ready store."""
    store.get("warm-up")


def test_a_first_execution_costs_two_round_trips_and_a_retried_duplicate_one(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = Router()
    router.task("send_receipt")(lambda payload, ctx: {"ok": True})
    store = PostgresStore.from_url(postgres_url)
    app = create_app(router, store=store, auth="none")
    _warm(store)
    counter = StatementCounter(monkeypatch)

    def deliver(retry: int) -> str:
        headers = task_headers(retry=retry, execution=retry)
        response = app.test_client().post("/tasks/send_receipt", headers=headers, data=b"{}")
        return str(response.headers["X-Tasklease-Outcome"])

    assert deliver(0) == "processed"
    assert counter.take() == ["WITH", "UPDATE"]  # The claim, the conditional completion.
    assert deliver(1) == "duplicate"
    assert counter.take() == ["SELECT"]  # A retry reads first: one round trip.
    assert deliver(0) == "duplicate"  # Not marked as a retry: the claim statement answers.
    assert counter.take() == ["WITH"]
    store.close()


def test_a_takeover_costs_two_round_trips_and_a_finish_elsewhere_two(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore.from_url(f"{postgres_url}&server_clock=off")
    other = PostgresStore.from_url(f"{postgres_url}&server_clock=off")  # Another process.
    _warm(store)
    _warm(other)
    counter = StatementCounter(monkeypatch)
    store.claim(claim_request(), T0)
    assert counter.take() == ["WITH"]
    assert store.claim(claim_request(attempt_id="a2"), T0 + EXPIRED).verdict is Verdict.CLAIMED
    assert counter.take() == ["WITH", "UPDATE"]
    assert other.complete("run-1", "a2", None, T0 + EXPIRED)  # It never saw the claim.
    assert counter.take() == ["SELECT", "UPDATE"]
    store.close()
    other.close()


def test_a_childs_finish_and_count_cost_one_round_trip_and_two_from_another_process(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run row's write, the child's entry and its join's count are one statement."""
    store = PostgresStore.from_url(f"{postgres_url}&server_clock=off")
    other = PostgresStore.from_url(f"{postgres_url}&server_clock=off")  # Another process.
    _warm(store)
    _warm(other)
    first, second = family(2)
    store.claim(claim_request("child-k000", "a1"), T0)
    store.claim(claim_request("child-k001", "a1"), T0)
    counter = StatementCounter(monkeypatch)
    progress = store.complete_member(first, "child-k000", "a1", '"one"', T0)
    assert progress is not None and not progress.closed
    assert counter.take() == ["WITH"]
    closing = other.complete_member(second, "child-k001", "a1", '"two"', T0)
    assert closing is not None and closing.closed
    assert counter.take() == ["SELECT", "WITH"]  # It never saw the claim: a read first.
    assert store.count_member(second, "child-k001", T0).closed  # A duplicate's recount.
    assert counter.take() == ["SELECT", "WITH"]
    join = store.get_fan_in(first.join_id)
    assert join is not None and (join.completed, join.failed) == (2, 0)
    store.close()
    other.close()


def test_a_finish_sends_only_the_columns_it_changes_and_the_row_reads_back_whole(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write conditional on the version of a row whose record the store holds sends only
    what changes (fewer values to encode and send); the row is the whole record after."""
    store = PostgresStore.from_url(f"{postgres_url}&server_clock=off")
    _warm(store)
    sent: list[str] = []
    original = psycopg.Connection.execute

    def execute(connection: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return original(connection, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", execute)
    request = claim_request(caller="sa@example.com")
    claimed = store.claim(request, T0).record
    assert store.complete("run-1", request.attempt_id, '{"ok":true}', T0 + timedelta(seconds=1))
    update = sent[-1]
    assert update.startswith("UPDATE")
    assert '"status"' in update and '"result_json"' in update and '"finished_at"' in update
    for unchanged in ('"identity"', '"caller"', '"handler"', '"claimed_at"', '"attempt_id"'):
        assert unchanged not in update
    done = store.get("run-1")
    assert done is not None and done.status is RunStatus.COMPLETED
    assert done.result_json == '{"ok":true}' and done.finished_at == T0 + timedelta(seconds=1)
    assert (done.identity, done.caller, done.claimed_at) == (
        claimed.identity,
        claimed.caller,
        claimed.claimed_at,
    )
    store.close()


# --- The server's clock ----------------------------------------------------------------


def test_with_the_server_clock_a_skewed_instance_clock_decides_nothing(
    postgres_url: str,
) -> None:
    store = PostgresStore.from_url(postgres_url)
    behind = lambda: datetime.now(UTC) - timedelta(hours=1)  # noqa: E731
    ahead = lambda: datetime.now(UTC) + timedelta(hours=1)  # noqa: E731
    record = store.claim(claim_request(lease=timedelta(minutes=5)), behind).record
    server_now = postgres_now(store)
    assert abs(record.claimed_at - server_now) < timedelta(minutes=1)
    # An instance an hour ahead would see that lease long expired: the server says it is not.
    claim = store.claim(claim_request(attempt_id="a2"), ahead)
    assert claim.verdict is Verdict.IN_PROGRESS
    assert store.complete("run-1", "attempt-1", '"ok"', behind)
    finished = store.get("run-1")
    assert finished is not None and finished.finished_at is not None
    assert abs(finished.finished_at - server_now) < timedelta(minutes=1)
    store.close()


def test_with_the_server_clock_a_childs_finish_and_its_join_take_the_servers_time(
    postgres_url: str,
) -> None:
    store = PostgresStore.from_url(postgres_url)
    behind = lambda: datetime.now(UTC) - timedelta(hours=1)  # noqa: E731
    first, second = family(2)
    for member in (first, second):
        store.claim(claim_request(f"child-{member.key}", "a1"), behind)
    progress = store.complete_member(first, "child-k000", "a1", '"ok"', behind)  # No read.
    assert progress is not None and not progress.closed
    assert store.complete("child-k001", "a1", '"ok"', behind)  # Counted by a recount (read).
    assert store.count_member(second, "child-k001", behind).closed
    server_now = postgres_now(store)
    join = store.get_fan_in(first.join_id)
    assert join is not None
    assert abs(join.created_at - server_now) < timedelta(minutes=1)
    assert join.expire_at > server_now + timedelta(days=6)
    for entry in store.fan_in_entries(first.join_id):
        record = store.get(entry.run_id)
        assert record is not None and record.finished_at == entry.finished_at
        assert abs(entry.finished_at - server_now) < timedelta(minutes=1)
    store.close()


def postgres_now(store: PostgresStore) -> datetime:
    at: datetime = store.connections.call(
        "read the time",
        lambda c: c.execute("SELECT now()").fetchone()[0],  # type: ignore[index]
    )
    return at


# --- A frozen server, a restarted one ----------------------------------------------------


@pytest.fixture
def own_cluster() -> Iterator[postgres_support.Cluster]:
    """A cluster of this test's own: it is frozen or restarted."""
    with postgres_support.running_cluster() as cluster:
        yield cluster


def _in_thread(call: Callable[[], Any], hang: float = 30) -> Any:
    """``call()``'s result or exception; fails if it hangs (the bug this guards against)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(hang)
    assert not thread.is_alive(), "the store call hung on a frozen server"
    return outcome[0]


def test_a_frozen_server_is_answered_store_unavailable_and_then_recovers(
    own_cluster: postgres_support.Cluster,
) -> None:
    store = PostgresStore.from_url(
        own_cluster.url(statement_timeout="1", pool_timeout="1", max_size="2")
    )
    store.claim(claim_request("before"), T0)
    with own_cluster.frozen():
        # The pooled connection's call, and calls needing new connections (pool of two).
        outcomes = [
            _in_thread(functools.partial(lambda n: store.claim(claim_request(f"r{n}"), T0), n))
            for n in range(3)
        ]
    for outcome in outcomes:
        assert isinstance(outcome, StoreUnavailable), outcome
    assert "did not answer within 2s" in str(outcomes[0])  # Cut by the client: server stopped.
    assert store.claim(claim_request("after"), T0).verdict is Verdict.CLAIMED
    assert store.get("before") is not None
    store.close()


def test_a_restarted_server_is_reconnected_to_and_kept_every_record(
    own_cluster: postgres_support.Cluster,
) -> None:
    store = PostgresStore.from_url(own_cluster.url(statement_timeout="2", pool_timeout="5"))
    store.claim(claim_request(), T0)
    assert store.complete("run-1", "attempt-1", '"ok"', T0)
    own_cluster.restart()
    claim = store.claim(claim_request(attempt_id="attempt-2"), T0)
    assert claim.verdict is Verdict.COMPLETED
    assert claim.record.result == "ok"
    store.close()


# --- Schema, purge, URLs ----------------------------------------------------------------


def test_the_schema_is_created_in_an_empty_database_and_reopening_changes_nothing(
    postgres_cluster: postgres_support.Cluster,
) -> None:
    schema = postgres_support.fresh_schema()
    url = postgres_cluster.url(schema=schema)
    first = PostgresStore.from_url(url)
    first.claim(claim_request(), T0)
    first.close()
    again = PostgresStore.from_url(url)
    assert again.get("run-1") is not None
    again.close()
    rows = postgres_cluster.sql(f"SELECT component, version FROM {schema}.schema_version")
    assert rows == [("store", SCHEMA_VERSION)]
    tables = postgres_cluster.sql(
        f"SELECT tablename FROM pg_tables WHERE schemaname = '{schema}' ORDER BY 1"
    )
    assert tables == [
        ("delivery_tally",),
        ("fan_in_entries",),
        ("fan_ins",),
        ("locks",),
        ("runs",),
        ("schema_version",),
    ]


def test_a_newer_schema_is_refused_with_a_message(
    postgres_cluster: postgres_support.Cluster,
) -> None:
    schema = postgres_support.fresh_schema()
    PostgresStore.from_url(postgres_cluster.url(schema=schema)).get("x")
    postgres_cluster.sql(f"UPDATE {schema}.schema_version SET version = 99")
    with pytest.raises(StoreUnavailable, match="upgrade tasklease"):
        PostgresStore.from_url(postgres_cluster.url(schema=schema)).get("x")


def test_purge_deletes_in_bounded_batches(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore.from_url(f"{postgres_url}&purge_batch=3")
    for n in range(10):
        store.claim(claim_request(f"old-{n}", retention=timedelta(minutes=1)), T0)
    store.claim(claim_request("new"), T0)
    counter = StatementCounter(monkeypatch)
    assert store.purge_expired(T0 + timedelta(days=1)) == 10
    # 3 + 3 + 3 + 1 runs, the locks (none), the joins (none), the delivery tally's old minutes.
    assert counter.take() == ["DELETE"] * 5 + ["WITH", "DELETE"]
    assert store.get("new") is not None
    store.close()


def test_purge_deletes_expired_joins_with_their_entries_in_bounded_batches(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore.from_url(f"{postgres_url}&purge_batch=3&server_clock=off")
    kept = {n: timedelta(hours=1) for n in range(4)} | {4: JOIN_KEEP_FLOOR * 2}
    joins = []
    for n, keep_for in kept.items():
        first, second = family(2, parent=f"parent-{n}")
        for member in (first, second):
            run_id = f"child-{n}-{member.key}"
            store.claim(claim_request(run_id, "a1", retention=JOIN_KEEP_FLOOR * 3), T0)
            store.complete_member(member, run_id, "a1", "1", T0, keep_for=keep_for)
        joins.append(first.join_id)
    counter = StatementCounter(monkeypatch)
    # Kept their floor past their last count, though their children named an hour.
    assert store.purge_expired(T0 + timedelta(days=1)) == 0
    counter.take()
    assert store.purge_expired(T0 + JOIN_KEEP_FLOOR + timedelta(days=1)) == 4
    assert counter.take() == ["DELETE", "DELETE", "WITH", "WITH", "DELETE"]  # Joins: 3, 1.
    assert [store.get_fan_in(join) is None for join in joins] == [True] * 4 + [False]
    count = f"SELECT join_id, count(*) FROM {store.options.schema}.fan_in_entries GROUP BY 1"
    entries = store.connections.call("count entries", lambda c: c.execute(count).fetchall())
    assert entries == [(joins[4], 2)]
    store.close()


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_store_url_picks_postgres_with_its_options(scheme: str) -> None:
    store = store_from_url(
        f"{scheme}://app:secret@/shop?host=/cloudsql/p:r:i&schema=jobs&min_size=0&max_size=4"
        "&statement_timeout=2.5&server_clock=off"
    )
    assert isinstance(store, PostgresStore)
    assert store.options == Options(
        schema="jobs", min_size=0, max_size=4, statement_timeout=2.5, server_clock=False
    )
    assert "secret" not in repr(store)
    assert "host='/cloudsql/p:r:i'" in repr(store)


@pytest.mark.parametrize(
    "query", ["max_size=0", "schema=Robert');DROP", "statement_timeout=soon", "server_clock=maybe"]
)
def test_bad_store_options_are_a_configuration_error(query: str) -> None:
    with pytest.raises(ConfigurationError):
        store_from_url(f"postgresql://localhost/db?{query}")


def test_without_psycopg_the_store_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tasklease.worker.stores.postgres.store", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'tasklease\[postgres\]'"):
        store_from_url("postgresql://localhost/db")
