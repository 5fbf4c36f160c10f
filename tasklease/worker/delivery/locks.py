"""The lock an execution holds while it runs: an exclusive job's, or its concurrency key's.

Taken after the run's claim, so a crash between the two leaves a claim whose lease lapses,
never a lock without a claim; a lock whose holder crashed lapses by its own lease and safety
expiry. It is renewed with the run's lease (:mod:`tasklease.worker.delivery.lease`) and released,
fenced by the attempt id, before the run's finish is written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tasklease.errors import StoreUnavailable
from tasklease.worker.core import constants as c
from tasklease.worker.core import locking
from tasklease.worker.core.identity import Kind
from tasklease.worker.core.outcome import Outcome, lock_retry_after
from tasklease.worker.core.records import LockGrant, LockRequest
from tasklease.worker.delivery.lease import local_deadline
from tasklease.worker.delivery.reply import Reply
from tasklease.worker.handlers.attempt import Attempt
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import HandlerSpec
from tasklease.worker.stores.base.locks import lock_store
from tasklease.worker.stores.base.retries import retry_while_unavailable
from tasklease.worker.stores.base.store import LeaseStore

_log = logging.getLogger("tasklease.execution")


@dataclass(frozen=True)
class Overlap:
    """An execution whose lock another run holds: the write that ends its claim (recorded
    as skipped, or given back unused), and the answer once that write is made."""

    write: Callable[[], bool]
    reply: Reply


class ExecutionLocks:
    """Takes, and releases, the lock each execution of an exclusive job or keyed task holds."""

    def __init__(self, store: LeaseStore, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.clock = clock

    def request_for(
        self, spec: HandlerSpec, ctx: TaskContext, payload: Any
    ) -> LockRequest | str | None:
        """The lock this execution must hold first (None: none); a str says why the payload
        has no concurrency key (a permanent failure: no retry will give it one)."""
        if spec.exclusive:
            name = locking.job_lock_name(spec.name, ctx.project, ctx.location)
        elif spec.concurrency_key is not None:
            try:
                key = spec.concurrency_key(payload)
            except Exception as exc:
                return f"concurrency_key raised {type(exc).__name__}: {exc}"
            if key is None or not isinstance(key, (str, int)) or isinstance(key, bool):
                return f"concurrency_key gave {key!r}: a str or int is needed"
            if len(str(key)) > c.MAX_CONCURRENCY_KEY_LENGTH:
                return f"concurrency_key is over {c.MAX_CONCURRENCY_KEY_LENGTH} characters"
            name = locking.key_lock_name(spec.name, ctx.project, ctx.location, str(key))
        else:
            return None
        return LockRequest(
            name=name,
            run_id=ctx.run_id,
            attempt_id=ctx.attempt_id,
            lease=spec.lease,
            max_runtime=spec.max_runtime,
            min_gap=spec.min_gap,
        )

    def take(
        self, spec: HandlerSpec, live: Attempt, request: LockRequest, *, continued: bool = False
    ) -> Overlap | None:
        """Acquire ``request``'s lock for the claimed ``live``: None once held, else how the
        overlap ends. A ``continued`` run (a continuation's delivery) is never skipped: the
        lock is held per delivery, so another run may hold it between two deliveries of a
        chain, and the continuation waits for it (409) rather than ending its run. Raises
        :class:`StoreUnavailable` with ``live.lock`` set, so that giving the claim back also
        releases a lock whose write may have landed unseen (fenced by attempt id, so harmless
        if it did not)."""
        asked_at, asked = self.clock(), live.timing.monotonic()
        live.lock = request.name
        grant = lock_store(self.store).acquire_lock(request, self.clock)
        if not grant.acquired:
            live.lock = None
            return self._overlap(spec, live, request.name, grant, continued)
        live.lock_fencing_token = grant.lock.fencing_token
        deadline = local_deadline(
            grant.lock.lease_expires, asked_at, asked, spec.lease, live.timing.monotonic()
        )
        live.confirm_lease(live.lease_expires, min(live.lease_deadline, deadline))
        return None

    def _overlap(
        self, spec: HandlerSpec, live: Attempt, name: str, grant: LockGrant, continued: bool
    ) -> Overlap:
        holder = grant.lock.holder_run_id
        if spec.kind is Kind.SCHEDULER and spec.on_overlap == "skip" and not continued:
            return Overlap(
                lambda: self.store.skip(live.run_id, live.attempt_id, holder, name, self.clock),
                Reply.of(
                    Outcome.SKIPPED_OVERLAP,
                    f"skipped: run {holder} holds the job",
                    live.run_id,
                    {"status": "skipped", "held_by": holder},
                ),
            )
        assert grant.free_at is not None
        retry_after = lock_retry_after(grant.free_at, self.clock(), released=grant.lock.released)
        outcome = Outcome.KEY_BUSY if spec.kind is Kind.TASK else Outcome.IN_PROGRESS
        what = "its concurrency key" if spec.kind is Kind.TASK else "the job"
        return Overlap(
            lambda: self.store.yield_claim(
                live.run_id,
                live.attempt_id,
                f"{outcome.value}: {name} held by {holder}",
                self.clock,
            ),
            Reply.of(
                outcome,
                f"run {holder} holds {what}; retry later",
                live.run_id,
                {"held_by": holder},
                retry_after=retry_after,
            ),
        )

    def release(self, live: Attempt) -> bool:
        """Release the lock ``live`` holds, fenced by its attempt id. False: another run took
        it (this attempt's lease lapsed meanwhile). Retried on store errors like a finish;
        if the store stays down, the lock lapses by itself.

        A retry that finds another holder is not a takeover when the first try was sent while
        this attempt's lease still held and that holder took the lock after it: the first try
        landed unheard and the next run took the freed lock, or the lease lapsed after the
        handler had ended; either way nothing overlapped this run's execution. A holder from
        before the first try was let in by an operator's forced release: refused, as on a
        first try. Raises :class:`StoreUnavailable` when the lock cannot be read to tell the
        two apart: the outcome cannot be recorded, but nothing took the run over."""
        name = live.lock
        if name is None:
            return True
        held_when_sent, sent_at = not live.lease_lost, self.clock()
        tries = 0

        def release_once() -> bool:
            nonlocal tries
            tries += 1
            return lock_store(self.store).release_lock(name, live.attempt_id, self.clock)

        try:
            released = retry_while_unavailable(release_once, live.timing.sleep)
        except StoreUnavailable:
            _log.warning("run %s: could not release lock %s", live.run_id, name)
            return True
        live.lock = None
        if released or tries == 1 or not held_when_sent:
            return released
        return self._taken_after(name, sent_at, live)

    def _taken_after(self, name: str, sent_at: datetime, live: Attempt) -> bool:
        """Whether the lock's holder now took it after ``sent_at`` (this instance's clock, so
        less the skew the protocol allows between instances). Read with the release's
        retries; StoreUnavailable if the store stays down (not a takeover: the queue would
        be told another attempt took the run while this one's lease still holds)."""
        lock = retry_while_unavailable(
            lambda: lock_store(self.store).get_lock(name), live.timing.sleep
        )
        return lock is not None and lock.started_at >= sent_at - c.MAX_CLOCK_SKEW
