"""The relay: the one piece that moves outbox entries to Cloud Tasks.

Each round claims a batch of due entries, creates their tasks under their stored names
through the producer's batched create path (ALREADY_EXISTS counts as created: an earlier
send, or another relay, got there first), then marks them sent. Only an entry whose task was
created (or already existed) is marked sent. A permanent refusal (too large, no such queue,
INVALID_ARGUMENT) marks that entry failed with the reason; the batch's other entries go on. A
transient error backs the entry off exponentially (capped); the relay itself keeps going.
An exception that is not an API answer is tracked down to its entries (each sent alone), so
one entry the client library cannot build never stalls the others, and neither does a row
that cannot be decoded (the claim marks it failed). An entry whose URL, token audience or
account is not the configured one (:mod:`tasklease.outbox.destinations`) is never sent: it is
marked failed with the reason. Every so often the relay also deletes sent entries older than
``keep_sent`` (a bounded delete), so an outbox without the sweeper job does not grow forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tasklease.outbox import metrics
from tasklease.outbox.base import OutboxDB
from tasklease.outbox.destinations import Destinations, for_producer
from tasklease.outbox.entries import Entry, Undecodable
from tasklease.producer.attempts import failed_result
from tasklease.producer.errors import (
    EnqueueError,
    InvalidTask,
    PermanentEnqueueError,
    TransientEnqueueError,
)
from tasklease.producer.producer import Producer
from tasklease.producer.results import EnqueueResult
from tasklease.producer.retry import RetryPolicy

_log = logging.getLogger("tasklease.outbox")

BATCH = 500  # Entries per claim: five BatchCreateTasks calls of 100.
LEASE = 60.0  # Seconds a claim holds its entries from other relays.
KEEP_SENT = 7 * 24 * 3600.0  # Seconds a sent entry is kept (as the sweeper's ``keep_sent``).
PURGE_EVERY = 600.0  # Seconds between a relay's purges of old sent entries.
PURGE_LIMIT = 1000  # Sent entries one purge deletes at most (the rest: at the next round).


def backoff(attempts: int, base: float = 0.5, cap: float = 60.0) -> float:
    """Seconds before retrying an entry that failed transiently ``attempts`` times (>= 1)."""
    return float(min(cap, base * 2.0 ** max(0, attempts - 1)))


@dataclass(frozen=True)
class Round:
    """What one relay round did."""

    claimed: int = 0
    sent: int = 0
    failed: int = 0
    retrying: int = 0
    purged: int = 0


@dataclass
class Relay:
    """Relays the outbox behind ``db`` with ``producer`` (its transport and batching).

    ``destinations``: where entries may go (default: under the producer's worker URL and the
    prefixes of ``TASKLEASE_OUTBOX_ALLOWED_URLS``, with the producer's audience and account).
    ``keep_sent``: seconds sent entries are kept before the relay deletes them (None: never).
    """

    db: OutboxDB
    producer: Producer
    batch: int = BATCH
    lease: float = LEASE
    backoff_cap: float = 60.0
    clock: Callable[[], float] = time.time
    destinations: Destinations | None = None
    keep_sent: float | None = KEEP_SENT
    purge_every: float = PURGE_EVERY
    purge_limit: int = PURGE_LIMIT
    _stopped: threading.Event = field(default_factory=threading.Event)
    _allowed: Destinations = field(init=False)
    _next_purge: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._allowed = self.destinations or for_producer(self.producer)

    def run_once(self) -> Round:
        """Claim and send one batch."""
        now = self.clock()
        claimed = self.db.claim(self.batch, now, self.lease)
        if not claimed:
            return Round()
        entries: list[Entry] = []
        refused: dict[str, str] = {}
        undecodable = 0
        for item in claimed:
            if isinstance(item, Undecodable):  # Marked failed by the claim already.
                undecodable += 1
                _log.error("outbox entry %s failed for good: %s", item.id, item.reason)
            elif (reason := self._allowed.refusal(item.request)) is not None:
                refused[item.id] = reason
                _log.error("outbox entry %s failed for good: %s", item.id, reason)
            else:
                entries.append(item)
        results = self._send(entries) if entries else []
        done = self.clock()
        sent: list[str] = []
        failed: dict[str, str] = dict(refused)
        retries: dict[str, tuple[float, str]] = {}
        for entry, result in zip(entries, results, strict=True):
            if result.ok:
                sent.append(entry.id)
                metrics.relayed(entry.task_name, done - entry.created_at)
            elif isinstance(result.error, PermanentEnqueueError | InvalidTask):
                failed[entry.id] = str(result.error)
                _log.error("outbox entry %s failed for good: %s", entry.id, result.error)
            else:
                pause = backoff(entry.attempts + 1, cap=self.backoff_cap)
                retries[entry.id] = (done + pause, str(result.error))
        # Sent first: the entries Cloud Tasks has must not be re-claimed after the lease.
        if sent:
            self.db.mark_sent(sent, done)
        if failed:
            self.db.mark_failed(failed)
        if retries:
            self.db.retry_later(retries)
            _log.warning(
                "outbox: %d entries not created (Cloud Tasks unavailable?), backing off",
                len(retries),
            )
        return Round(len(claimed), len(sent), len(failed) + undecodable, len(retries))

    def _send(self, entries: list[Entry]) -> list[EnqueueResult]:
        try:
            return self.producer.send([(None, entry.request) for entry in entries])
        except Exception:  # Not an API answer: find the entries it is about, one by one.
            _log.exception("outbox: a batch of %d entries could not be sent", len(entries))
            return [self._send_alone(entry) for entry in entries]

    def purge_due(self) -> int:
        """Delete up to ``purge_limit`` sent entries older than ``keep_sent``, when the last
        purge is ``purge_every`` s ago (at once again when it found more than the limit)."""
        now = self.clock()
        if self.keep_sent is None or now < self._next_purge:
            return 0
        purged = self.db.purge_sent(now - self.keep_sent, limit=self.purge_limit)
        self._next_purge = now if purged >= self.purge_limit else now + self.purge_every
        return purged

    def _send_alone(self, entry: Entry) -> EnqueueResult:
        """One entry's create; an exception that is not an API answer becomes its result: a
        request the client library cannot build (``TypeError``, ``ValueError``) will never
        be sent, so it fails for good; any other backs the entry off. Either way the
        entry is marked, and never holds up the others."""
        request = entry.request
        try:
            return self.producer.send([(None, request)])[0]
        except (TypeError, ValueError) as exc:
            error: EnqueueError = PermanentEnqueueError(
                f"the client library cannot build this task: {type(exc).__name__}: {exc}"
            )
        except Exception as exc:
            error = TransientEnqueueError(f"{type(exc).__name__}: {exc}")
        return failed_result(request, None, 1, error)

    def drain(self, max_rounds: int = 1000) -> Round:
        """Rounds until nothing due is left (or a round only backed off); the totals."""
        total = Round()
        for _ in range(max_rounds):
            one = self.run_once()
            total = Round(
                total.claimed + one.claimed,
                total.sent + one.sent,
                total.failed + one.failed,
                total.retrying + one.retrying,
            )
            if one.claimed < self.batch or one.sent + one.failed == 0:
                break
        return Round(total.claimed, total.sent, total.failed, total.retrying, self.purge_due())

    def follow(self, poll: float = 1.0) -> None:
        """Relay until :meth:`stop`: woken at once by a Postgres NOTIFY, else every ``poll`` s."""
        while not self._stopped.is_set():
            try:
                self.drain()
                metrics.observe(*self.db.pending(self.clock()))
                self.db.wait(poll)
            except Exception:  # The thread must outlive any one round (or wait) that fails.
                _log.exception("outbox relay round failed; trying again in %.1f s", poll)
                self._stopped.wait(poll)

    def stop(self) -> None:
        self._stopped.set()


def quick_retry() -> RetryPolicy:
    """A relay's producer gives up fast on a transient error: the entry backs off instead."""
    return RetryPolicy(max_attempts=2, initial=0.05, maximum=0.2)
