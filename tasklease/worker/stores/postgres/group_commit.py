"""Group commit: one process's concurrent claims (or finishes), sent in one transaction.

Each first claim and each finish is one statement and one commit, and the commit (the WAL
flush) is most of what the server spends on it. So the statements that the threads of one
process send at the same time go together: the first thread to arrive, finding no batch in
flight, leads. It sends its statement and every statement queued meanwhile (up to
:data:`MAX_BATCH`) on its own connection in pipeline mode with one Sync: one round trip and
one commit for all of them, then hands each thread its row. Threads arriving while a batch is
in flight queue; when it returns, the first of them leads the next. No timer: a thread
arriving alone is sent at once, exactly as without group commit (its statement alone,
autocommit). A process has two such groups, one for claims and one for finishes: a claim
need not wait for a batch of finishes in flight, and a batch of finishes (updates of rows
already committed) never waits on a batch of claims.

The statements between two Syncs run in one implicit transaction, committed at the Sync, or
rolled back whole if one fails (postgresql.org/docs/current/protocol-flow.html, "Pipelining").
Each keeps its own ``statement_timestamp()`` (set at each Bind message); ``now()`` would be
the batch's start. A batch locks its rows in run id order, as every batch does, so two
processes' batches cannot deadlock; a second statement on a run already in the batch waits
for the next batch (then it runs after the first, as sent one at a time). A fan-out child's
finish locks its join's row too, after its run's (:mod:`.fan_ins`), and is sorted by its join
first, so batches take join rows in one order as well; two batches can then wait on each
other only over a run both hold a statement on (a stale attempt's finish racing the one
that took over), and the bound on lock waits below ends that.

A batch waits on a lock no longer than :data:`BATCH_LOCK_WAIT_MS`: a member whose row
another transaction is writing would otherwise hold every member (and the queue behind) up
to ``statement_timeout``, past their own deadlines. Past it the batch fails. A lone
statement is not bounded (it is sent as without group commit), so a statement queued behind
one waits :data:`QUEUE_WAIT_MS` at most, then leaves the queue and is sent alone: a lone
statement waiting on a lock holds neither the queue nor the connections queued on it.

A batch that fails (a member's statement raised, a deadlock, a timeout, the connection
broken, even after the commit was sent) has each member send its statement again alone, on
its own connection, in its own thread: that is the path without group commit, so every
member ends as it would have alone (a claim whose write landed recognises it by its attempt
id, and a write whose answer is lost raises StoreUnavailable there, the orphan included).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from psycopg import Connection

MAX_BATCH = 32
# How long a batch may wait on a lock (a row another transaction is writing: a duplicate's
# claim, a finish behind a transactional step). Past it the batch fails and each member is
# sent alone: a member waiting on a lock waits alone, as without group commit, and holds up
# none of the others. Milliseconds.
BATCH_LOCK_WAIT_MS = 100
# Local to the batch's implicit transaction: gone at its Sync, committed or not.
LOCK_WAIT = "SELECT set_config('lock_timeout', %s, true)"
# How long a statement waits in the queue (a lone statement in flight may wait on a lock up
# to statement_timeout, on a connection of its own). Past it the statement leaves the queue
# and is sent alone: the queue never holds the pool's other connections idle behind a
# statement waiting on a lock. Milliseconds: a batch's bound on its lock waits, and as much
# for its round trip.
QUEUE_WAIT_MS = 2 * BATCH_LOCK_WAIT_MS

# A statement's row (None: no row), the time it was sent, and the time its answer came.
Fetched = tuple[Any, datetime, datetime]


def _utc_now() -> datetime:
    return datetime.now(UTC)


def fetch_alone(connection: Connection[Any], statement: str, params: Any) -> Fetched:
    """The statement on its own (autocommit): its row, and when it was sent and answered."""
    sent = _utc_now()
    row = connection.execute(statement, params).fetchone()
    return row, sent, _utc_now()


@dataclass(eq=False)
class _Member:
    run_id: str
    statement: str
    params: Sequence[Any]
    order: tuple[str, ...]  # Where the batch sends it: by the rows it locks, in their order.
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # Woken to lead the next batch.
    fetched: Fetched | None = None  # None once done: the batch failed, send it alone.


class StatementBatcher:
    """Group commit of Postgres statements, pipelined: one process's batches (made per
    process: a lock and a queue do not cross a fork).

    ``batches`` counts the batches of two or more statements sent, ``batched`` the statements
    in them, ``failed`` the batches whose transaction failed (each member then sent alone)."""

    def __init__(self, enabled: bool = True, max_batch: int = MAX_BATCH) -> None:
        self.enabled = enabled
        self._max = max_batch
        self._lock = threading.Lock()
        self._queue: list[_Member] = []
        self._busy = False
        self.batches = 0
        self.batched = 0
        self.failed = 0
        self.lock_wait_ms = BATCH_LOCK_WAIT_MS
        self.queue_wait_ms = QUEUE_WAIT_MS

    def fetch(
        self,
        connection: Connection[Any],
        run_id: str,
        statement: str,
        params: Any,
        *,
        order: tuple[str, ...] | None = None,
    ) -> Fetched:
        """``statement``'s row on ``run_id``, sent alone or in a batch with other threads'
        that sorts it by ``order``: by default its run id; a statement that locks rows other
        runs' statements lock too names those first, so that batches take them in one order."""
        if not self.enabled:
            return fetch_alone(connection, statement, params)
        member = _Member(run_id, statement, params, order or (run_id,))
        with self._lock:
            if self._busy:
                self._queue.append(member)
            else:
                self._busy = member.lead = True
        if not member.lead and not member.done.wait(self.queue_wait_ms / 1000):
            with self._lock:
                left = member in self._queue  # Not yet in a batch, nor to lead the next.
                if left:
                    self._queue.remove(member)
            if left:
                return fetch_alone(connection, statement, params)
            member.done.wait()  # In a batch (its lock waits bounded), or to lead: soon.
        if member.lead:
            self._lead(connection, member)
        if member.fetched is None:
            return fetch_alone(connection, statement, params)
        return member.fetched

    def _lead(self, connection: Connection[Any], own: _Member) -> None:
        with self._lock:
            batch = self._take(own)
        try:
            if len(batch) == 1:  # Alone: today's statement, its errors the caller's.
                own.fetched = fetch_alone(connection, own.statement, own.params)
            else:
                self._send(connection, batch)
        finally:
            with self._lock:
                successor = self._queue.pop(0) if self._queue else None
                if successor is None:
                    self._busy = False
                else:
                    successor.lead = True
            for member in batch:
                if member is not own:
                    member.done.set()
            if successor is not None:
                successor.done.set()

    def _take(self, own: _Member) -> list[_Member]:
        """``own`` and the queued statements that fit, one per run, in their order (by
        run id, but for the rows some lock first)."""
        batch, runs, deferred = [own], {own.run_id}, []
        for member in self._queue:
            if len(batch) < self._max and member.run_id not in runs:
                batch.append(member)
                runs.add(member.run_id)
            else:
                deferred.append(member)
        self._queue = deferred
        batch.sort(key=lambda member: member.order)
        return batch

    def _send(self, connection: Connection[Any], batch: list[_Member]) -> None:
        """The batch in one pipeline and one Sync: one round trip, one transaction."""
        sent = _utc_now()
        try:
            # No pipeline.sync(): leaving the block sends a Sync and reads every result, and
            # a sync() inside would cost a second round trip for that one.
            with connection.pipeline():
                connection.execute(LOCK_WAIT, (f"{self.lock_wait_ms}ms",))
                cursors = [connection.execute(m.statement, m.params) for m in batch]
            rows = [cursor.fetchone() for cursor in cursors]
        except Exception:  # A psycopg error, or a member's parameters that do not encode.
            self.failed += 1
            return  # Nothing fetched: every member sends its statement alone.
        received = _utc_now()
        self.batches += 1
        self.batched += len(batch)
        for member, row in zip(batch, rows, strict=True):
            member.fetched = (row, sent, received)


def fetch(
    group: StatementBatcher | None,
    connection: Connection[Any],
    run_id: str,
    statement: str,
    params: Any,
    *,
    order: tuple[str, ...] | None = None,
) -> Fetched:
    """``statement`` through ``group`` (None: alone), sorted in a batch by ``order``."""
    if group is None:
        return fetch_alone(connection, statement, params)
    return group.fetch(connection, run_id, statement, params, order=order)
