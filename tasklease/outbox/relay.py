"""The relay: the one piece that moves outbox entries to Cloud Tasks.

Each round claims a batch of due entries, creates their tasks under their stored names
through the producer's batched create path (ALREADY_EXISTS counts as created: an earlier
send, or another relay, got there first), then marks them sent. Only an entry whose task was
created (or already existed) is marked sent. A permanent refusal (too large, no such queue,
INVALID_ARGUMENT) marks that entry failed with the reason; the batch's other entries go on. A
transient error backs the entry off exponentially (capped); the relay itself keeps going.
An exception that is not an API answer is tracked down to its entries (each sent alone), so
one entry the client library cannot build never stalls the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tasklease.outbox import metrics
from tasklease.outbox.db import OutboxDB
from tasklease.outbox.entries import Entry
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


@dataclass
class Relay:
    """Relays the outbox behind ``db`` with ``producer`` (its transport and batching)."""

    db: OutboxDB
    producer: Producer
    batch: int = BATCH
    lease: float = LEASE
    backoff_cap: float = 60.0
    clock: Callable[[], float] = time.time
    _stopped: threading.Event = field(default_factory=threading.Event)

    def run_once(self) -> Round:
        """Claim and send one batch."""
        now = self.clock()
        entries = self.db.claim(self.batch, now, self.lease)
        if not entries:
            return Round()
        try:
            results = self.producer.send([(None, entry.request) for entry in entries])
        except Exception:  # Not an API answer: find the entries it is about, one by one.
            _log.exception("outbox: a batch of %d entries could not be sent", len(entries))
            results = [self._send_alone(entry) for entry in entries]
        done = self.clock()
        sent: list[str] = []
        failed: dict[str, str] = {}
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
        return Round(len(entries), len(sent), len(failed), len(retries))

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
        return total

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
