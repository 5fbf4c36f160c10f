"""PostgresStore's group commit on a private cluster: concurrent claims and finishes of one
process go in shared transactions, each ending as it would alone, whatever fails."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg._pipeline_base import BasePipeline

from tasklease.testing.fan_in_contract import family
from tasklease.worker import Router, create_app
from tasklease.worker.core.records import RunStatus, Verdict
from tasklease.worker.stores.postgres import group_commit as postgres_group_commit
from tasklease.worker.stores.postgres.group_commit import LOCK_WAIT, StatementBatcher
from tasklease.worker.stores.postgres.options import Options
from tasklease.worker.stores.postgres.schema import Statements
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support import postgres as postgres_support
from tests.support.helpers import T0, claim_request, task_headers
from tests.support.row_locks import wait_for

pytestmark = pytest.mark.service

THREADS = 16


def groups_of(store: PostgresStore) -> tuple[StatementBatcher, StatementBatcher]:
    """The store's batches of claims, and of finishes, in this process."""
    process = store.connections.process()
    return process.claims, process.finishes


def batches(store: PostgresStore) -> tuple[int, int, int]:
    """How many batches (of two or more) it sent, the statements in them, and the batches
    that failed."""
    claims, finishes = groups_of(store)
    return (
        claims.batches + finishes.batches,
        claims.batched + finishes.batched,
        claims.failed + finishes.failed,
    )


def in_threads(count: int, work: Callable[[int], Any]) -> list[Any]:
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(work, range(count)))


@pytest.mark.parametrize("group_commit", ["on", "off"])
def test_concurrent_claims_and_finishes_each_end_as_they_would_one_at_a_time(
    postgres_url: str, group_commit: str
) -> None:
    store = PostgresStore.from_url(
        f"{postgres_url}&server_clock=off&max_size={THREADS}&group_commit={group_commit}"
    )
    store.get("warm-up")

    def first_executions(thread: int) -> list[tuple[Verdict, bool]]:
        outcomes = []
        for n in range(15):
            request = claim_request(f"run-{thread}-{n}", f"attempt-{thread}-{n}")
            verdict = store.claim(request, T0).verdict
            done = store.complete(request.run_id, request.attempt_id, f'"{thread}-{n}"', T0)
            outcomes.append((verdict, done))
        return outcomes

    outcomes = in_threads(THREADS, first_executions)
    assert all(outcome == [(Verdict.CLAIMED, True)] * 15 for outcome in outcomes)
    # Every thread's duplicates, two at once on each run: answered from the record.
    duplicates = in_threads(
        THREADS,
        lambda t: [
            store.claim(claim_request(f"run-{t // 2}-{n}", f"again-{t}-{n}"), T0) for n in range(15)
        ],
    )
    for thread, claims in enumerate(duplicates):
        for n, claim in enumerate(claims):
            assert claim.verdict is Verdict.COMPLETED
            assert claim.record.result == f"{thread // 2}-{n}"
    sent, batched, failed = batches(store)
    if group_commit == "on":
        assert sent > 0 and batched > sent, "no batch of two formed"
    else:
        assert sent == 0
    assert failed == 0
    store.close()


def test_two_processes_racing_on_the_same_runs_claim_each_exactly_once(
    postgres_url: str,
) -> None:
    """Two stores (two pools, as two processes) and their threads claim the same runs: each
    run is claimed by one attempt, every other is told it is in progress."""
    stores = [
        PostgresStore.from_url(f"{postgres_url}&server_clock=off&max_size=8") for _ in range(2)
    ]
    for store in stores:
        store.get("warm-up")
    runs = [f"race-{n}" for n in range(40)]

    def race(worker: int) -> list[tuple[str, Verdict]]:
        store = stores[worker % 2]
        order = runs if worker % 3 else list(reversed(runs))
        return [
            (run, store.claim(claim_request(run, f"a-{worker}-{run}"), T0).verdict) for run in order
        ]

    verdicts = [v for outcome in in_threads(12, race) for v in outcome]
    for run in runs:
        mine = [verdict for r, verdict in verdicts if r == run]
        assert mine.count(Verdict.CLAIMED) == 1, (run, mine)
        assert mine.count(Verdict.IN_PROGRESS) == 11, (run, mine)
    assert sum(batches(store)[0] for store in stores) > 0
    for store in stores:
        store.close()


@pytest.mark.parametrize("pools", [1, 2])
def test_children_of_one_join_finishing_at_once_share_commits_and_count_once_each(
    postgres_url: str, pools: int
) -> None:
    """Each child's finish writes its run, its entry and the join's row: batches of them
    (in one process, or two processes' batches waiting on the join's row in turn) count every
    child once, and exactly one finish is told the join closed."""
    stores = [
        PostgresStore.from_url(f"{postgres_url}&server_clock=off&max_size={THREADS}")
        for _ in range(pools)
    ]
    members = family(96)
    for n, member in enumerate(members):  # Each finished by the store that claimed it.
        stores[n % pools].claim(claim_request(f"child-{member.key}", f"a-{member.key}"), T0)

    def finish(thread: int) -> list[bool]:
        closed = []
        for n in range(thread, len(members), THREADS):
            member = members[n]
            run_id, attempt = f"child-{member.key}", f"a-{member.key}"
            progress = stores[n % pools].complete_member(member, run_id, attempt, "1", T0)
            assert progress is not None
            closed.append(progress.closed)
        return closed

    closed = [c for outcome in in_threads(THREADS, finish) for c in outcome]
    assert closed.count(True) == 1
    join = stores[0].get_fan_in(members[0].join_id)
    assert join is not None and (join.completed, join.expected) == (96, 96)
    assert len(stores[0].fan_in_entries(members[0].join_id)) == 96
    sent, batched, failed = batches(stores[0])
    assert sent > 0 and batched > sent, "no batch of two formed"
    if pools == 1:
        assert failed == 0
    for store in stores:
        store.close()


# --- A batch that fails ------------------------------------------------------------------


@contextmanager
def held_advisory_lock(url: str, key: int) -> Iterator[Callable[[], object]]:
    """An advisory lock held by a connection of the test's own; yields its release."""
    with psycopg.connect(url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (key,))
        yield lambda: holder.execute("SELECT pg_advisory_unlock(%s)", (key,))


def test_a_batch_with_a_failing_statement_sends_every_member_alone(
    postgres_cluster: postgres_support.Cluster,
) -> None:
    """One member's statement fails, so the batch's transaction wrote nothing: each member
    is sent again alone, and only the failing one sees its error."""
    url = postgres_cluster.url()
    table = f"gc_{postgres_support.fresh_schema()}"
    postgres_cluster.sql(f"CREATE TABLE {table} (id text PRIMARY KEY)")
    group = StatementBatcher()
    group.queue_wait_ms = 60_000  # The queue waits on the lone statement throughout.
    outcomes: dict[str, Any] = {}
    connections = [psycopg.connect(url, autocommit=True) for _ in range(6)]

    def member(index: int, statement: str, params: tuple[Any, ...]) -> None:
        try:
            outcomes[params[0]] = group.fetch(connections[index], params[0], statement, params)[0]
        except psycopg.Error as exc:
            outcomes[params[0]] = exc

    insert = f"INSERT INTO {table} VALUES (%s) RETURNING id"
    with held_advisory_lock(url, 7) as release:
        # A lone statement in flight (it waits on the lock): the others queue behind it.
        leader = threading.Thread(
            target=member,
            args=(0, "SELECT %s, pg_advisory_lock(7), pg_advisory_unlock(7)", ("lead",)),
        )
        leader.start()
        wait_for(lambda: group._busy, "the lone statement in flight")
        members = [
            threading.Thread(target=member, args=(n, insert, (f"r{n}",))) for n in range(1, 5)
        ]
        members.append(threading.Thread(target=member, args=(5, "SELECT %s, 1 / 0", ("z-bad",))))
        for thread in members:
            thread.start()
        wait_for(lambda: len(group._queue) == 5, "five statements queued")
        release()
        for thread in [leader, *members]:
            thread.join(30)
    assert group.failed == 1 and group.batches == 0
    assert outcomes["lead"][0] == "lead"
    assert [outcomes[f"r{n}"] for n in range(1, 5)] == [(f"r{n}",) for n in range(1, 5)]
    assert isinstance(outcomes["z-bad"], psycopg.errors.DivisionByZero)
    assert postgres_cluster.sql(f"SELECT count(*) FROM {table}") == [(4,)]
    for connection in connections:
        connection.close()


def test_a_batch_sends_its_statements_in_the_order_they_name(
    postgres_cluster: postgres_support.Cluster,
) -> None:
    """By run id, unless a statement names what it locks first (a fan-out child's finish:
    its join), so that batches take shared rows in one order."""
    url = postgres_cluster.url()
    table = f"gc_{postgres_support.fresh_schema()}"
    postgres_cluster.sql(f"CREATE TABLE {table} (id text PRIMARY KEY, n bigserial)")
    group = StatementBatcher()
    group.queue_wait_ms = 60_000  # The queue waits on the lone statement throughout.
    connections = [psycopg.connect(url, autocommit=True) for _ in range(5)]
    insert = f"INSERT INTO {table} (id) VALUES (%s) RETURNING id"
    orders = {"r1": ("join-2", "r1"), "r2": ("join-1", "r2"), "r3": None, "r4": ("join-1", "r4")}

    def member(index: int, statement: str, run_id: str) -> None:
        order = orders.get(run_id)
        group.fetch(connections[index], run_id, statement, (run_id,), order=order)

    with held_advisory_lock(url, 9) as release:
        leader = threading.Thread(
            target=member, args=(0, "SELECT %s, pg_advisory_lock(9), pg_advisory_unlock(9)", "r0")
        )
        leader.start()
        wait_for(lambda: group._busy, "the lone statement in flight")
        members = [threading.Thread(target=member, args=(n, insert, f"r{n}")) for n in range(1, 5)]
        for thread in members:
            thread.start()
        wait_for(lambda: len(group._queue) == 4, "four statements queued")
        release()
        for thread in [leader, *members]:
            thread.join(30)
    assert group.batches == 1 and group.failed == 0
    sent = postgres_cluster.sql(f"SELECT id FROM {table} ORDER BY n")
    assert sent == [("r2",), ("r4",), ("r1",), ("r3",)]
    for connection in connections:
        connection.close()


def test_a_batchs_bound_on_lock_waits_ends_with_the_batch(
    postgres_cluster: postgres_support.Cluster,
) -> None:
    """The batch bounds its lock waits for its own transaction only: every connection it
    went out on is back at the session's setting after it."""
    url = postgres_cluster.url()
    table = f"gc_{postgres_support.fresh_schema()}"
    postgres_cluster.sql(f"CREATE TABLE {table} (id text PRIMARY KEY)")
    group = StatementBatcher()
    group.queue_wait_ms = 60_000  # The queue waits on the lone statement throughout.
    connections = [psycopg.connect(url, autocommit=True) for _ in range(4)]
    insert = f"INSERT INTO {table} VALUES (%s) RETURNING id"

    def member(index: int, statement: str, params: tuple[Any, ...]) -> None:
        group.fetch(connections[index], params[0], statement, params)

    with held_advisory_lock(url, 8) as release:
        leader = threading.Thread(
            target=member,
            args=(0, "SELECT %s, pg_advisory_lock(8), pg_advisory_unlock(8)", ("lead",)),
        )
        leader.start()
        wait_for(lambda: group._busy, "the lone statement in flight")
        members = [
            threading.Thread(target=member, args=(n, insert, (f"r{n}",))) for n in range(1, 4)
        ]
        for thread in members:
            thread.start()
        wait_for(lambda: len(group._queue) == 3, "three statements queued")
        release()
        for thread in [leader, *members]:
            thread.join(30)
    assert group.batches == 1 and group.failed == 0
    for connection in connections:
        assert connection.execute("SHOW lock_timeout").fetchone() == ("0",)
        connection.close()


def test_a_batch_whose_connection_is_killed_mid_transaction_still_finishes_every_run(
    postgres_url: str, postgres_cluster: postgres_support.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch's backend is terminated while it waits on a row lock, after some of its
    members' writes: that transaction is gone, and every member finishes alone."""
    # The queue waits on the lone finish, then the batch on the row lock.
    monkeypatch.setattr(postgres_group_commit, "QUEUE_WAIT_MS", 60_000)
    monkeypatch.setattr(postgres_group_commit, "BATCH_LOCK_WAIT_MS", 60_000)
    store = PostgresStore.from_url(f"{postgres_url}&server_clock=off&max_size=12")
    schema = store.options.schema
    runs = [f"run-{n}" for n in range(9)]
    for run in runs:
        assert store.claim(claim_request(run, f"a-{run}"), T0).verdict is Verdict.CLAIMED
    url = postgres_cluster.url()
    first, blocker = (psycopg.connect(url) for _ in range(2))
    lock_row = f"SELECT 1 FROM {schema}.runs WHERE run_id = %s FOR UPDATE"
    first.execute(lock_row, ("run-0",))  # Holds the lone first finish.
    blocker.execute(lock_row, ("run-5",))  # Holds the batch behind it, mid-way.
    done: dict[str, bool] = {}

    def finish(run: str) -> None:
        done[run] = store.complete(run, f"a-{run}", '"ok"', T0)

    lone = threading.Thread(target=finish, args=("run-0",))
    lone.start()
    wait_for(lambda: groups_of(store)[1]._busy, "the first finish in flight")
    batch = [threading.Thread(target=finish, args=(run,)) for run in runs[1:]]
    for thread in batch:
        thread.start()
    wait_for(lambda: len(groups_of(store)[1]._queue) == 8, "eight finishes queued")
    first.commit()
    waiting = (
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'tasklease' "
        "AND wait_event_type = 'Lock'"
    )
    wait_for(lambda: bool(postgres_cluster.sql(waiting)), "the batch waiting on run-5")
    (pid,) = postgres_cluster.sql(waiting)[0]
    postgres_cluster.sql(f"SELECT pg_terminate_backend({pid})")
    wait_for(lambda: batches(store)[2] == 1, "the batch failed")
    blocker.commit()
    for thread in [lone, *batch]:
        thread.join(30)
    assert done == dict.fromkeys(runs, True)
    for run in runs:
        record = store.get(run)
        assert record is not None and record.status is RunStatus.COMPLETED, run
    first.close()
    blocker.close()
    store.close()


def test_batches_whose_commit_landed_but_whose_answer_was_lost_end_every_run_right(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch commits and then its answer is lost (as when the connection breaks after
    the Sync): every member sends its statement again alone, and the claims and finishes
    that already landed are recognised as this attempt's own."""
    store = PostgresStore.from_url(f"{postgres_url}&server_clock=off&max_size={THREADS}")
    store.get("warm-up")
    send = StatementBatcher._send
    lost = [0]

    def commit_then_lose_the_answer(group: StatementBatcher, connection: Any, batch: Any) -> None:
        send(group, connection, batch)  # Committed.
        for member in batch:
            member.fetched = None
        lost[0] += 1

    monkeypatch.setattr(StatementBatcher, "_send", commit_then_lose_the_answer)

    def first_executions(thread: int) -> list[tuple[Verdict, bool]]:
        outcomes = []
        for n in range(10):
            run, attempt = f"run-{thread}-{n}", f"attempt-{thread}-{n}"
            verdict = store.claim(claim_request(run, attempt), T0).verdict
            outcomes.append((verdict, store.complete(run, attempt, '"done"', T0)))
        return outcomes

    outcomes = in_threads(THREADS, first_executions)
    assert lost[0] > 0, "no batch formed"
    assert all(outcome == [(Verdict.CLAIMED, True)] * 10 for outcome in outcomes)
    for thread in range(THREADS):
        for n in range(10):
            record = store.get(f"run-{thread}-{n}")
            assert record is not None and record.status is RunStatus.COMPLETED
            assert record.attempts == 1 and record.result == "done"
    store.close()


# --- Round trips --------------------------------------------------------------------------


def test_concurrent_deliveries_cost_at_most_two_round_trips_each(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch is one round trip shared by its members: counted per delivery, a first
    execution still sends its two statements and costs at most two round trips."""
    router = Router()
    router.task("send_receipt")(lambda payload, ctx: {"ok": True})
    store = PostgresStore.from_url(f"{postgres_url}&max_size={THREADS}")
    app = create_app(router, store=store, auth="none")
    store.get("warm-up")
    statements: list[str] = []
    trips = [0]
    execute, sync = psycopg.Connection.execute, BasePipeline._enqueue_sync

    def counted_execute(connection: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        # Not a delivery's: a new pooled connection's clock reading, the tally's flush.
        # Nor a batch's bound on its lock waits, sent in the batch's round trip.
        if str(query) not in (Statements("x").now, LOCK_WAIT) and "delivery_tally" not in str(
            query
        ):
            statements.append(str(query).split()[0].upper())
            trips[0] += connection._pipeline is None
        return execute(connection, query, *args, **kwargs)

    def counted_sync(pipeline: Any) -> None:  # Each Sync a pipeline sends: a round trip.
        trips[0] += 1
        sync(pipeline)

    monkeypatch.setattr(psycopg.Connection, "execute", counted_execute)
    monkeypatch.setattr(BasePipeline, "_enqueue_sync", counted_sync)

    def deliver(thread: int) -> list[str]:
        client = app.test_client()
        return [
            str(
                client.post(
                    "/tasks/send_receipt", headers=task_headers(task=f"t-{thread}-{n}"), data=b"{}"
                ).headers["X-Tasklease-Outcome"]
            )
            for n in range(10)
        ]

    outcomes = in_threads(THREADS, deliver)
    deliveries = THREADS * 10
    assert all(outcome == ["processed"] * 10 for outcome in outcomes)
    assert sorted(statements) == sorted(["WITH", "UPDATE"] * deliveries)
    sent, batched, failed = batches(store)
    assert sent > 0 and failed == 0
    assert trips[0] == 2 * deliveries - batched + sent <= 2 * deliveries
    store.close()


def test_group_commit_is_on_unless_the_url_turns_it_off() -> None:
    assert Options().group_commit
    _, options = Options.from_url("postgresql://localhost/db?group_commit=off")
    assert options == Options(group_commit=False)


def test_a_child_forked_while_a_batch_is_in_flight_claims_without_waiting_for_it(
    postgres_url: str,
) -> None:
    """A process's batches are its own: a child forked while its parent's batch waits on
    the server starts with no batch in flight (a queue and a lock do not cross a fork)."""
    store = PostgresStore.from_url(f"{postgres_url}&server_clock=off")
    finishes = groups_of(store)[1]
    held = f"SELECT 1 FROM {store.options.schema}.runs WHERE run_id = %s FOR UPDATE"
    assert store.claim(claim_request("held", "a1"), T0).verdict is Verdict.CLAIMED
    with psycopg.connect(postgres_url.split("?", maxsplit=1)[0]) as blocker:
        blocker.execute(held, ("held",))
        # The parent's lone finish waits on the row lock: its finishes group is busy.
        waiting = threading.Thread(
            target=lambda: store.complete("held", "a1", None, T0), daemon=True
        )
        waiting.start()
        wait_for(lambda: finishes._busy, "the parent's finish in flight")
        pid = os.fork()
        if pid == 0:  # The child: claims and finishes of its own, at once, in threads.
            code = 1
            try:

                def first_execution(n: int) -> bool:
                    claimed = store.claim(claim_request(f"c{n}", f"a{n}"), T0)
                    done = store.complete(f"c{n}", f"a{n}", None, T0)
                    return claimed.verdict is Verdict.CLAIMED and done

                code = 0 if all(in_threads(4, first_execution)) else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0
        assert finishes._busy and waiting.is_alive()  # The parent's batch waited throughout.
        blocker.commit()
    waiting.join(30)
    record = store.get("held")
    assert record is not None and record.status is RunStatus.COMPLETED
    store.close()
