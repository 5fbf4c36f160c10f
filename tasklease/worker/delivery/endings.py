"""Writing how an execution ended: complete, fail, release for a retry, give the claim back,
each fenced by the attempt id, the execution's lock released first, and each write retried
while the store is briefly unavailable (:mod:`tasklease.worker.stores.base.retries`).

The plain path (:mod:`tasklease.worker.delivery.executor`) and the transactional path
(:mod:`tasklease.worker.delivery.transactional_run`) both end here, through the one table
of :func:`~tasklease.worker.core.endings.ending_of`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from tasklease.errors import StoreUnavailable
from tasklease.joins import Member
from tasklease.worker.core import decisions
from tasklease.worker.core.endings import Action, Ending
from tasklease.worker.core.fan_in import Progress
from tasklease.worker.core.identity import Kind
from tasklease.worker.core.outcome import Outcome
from tasklease.worker.core.records import RunStatus
from tasklease.worker.delivery.fan_in import FanIns
from tasklease.worker.delivery.locks import ExecutionLocks
from tasklease.worker.delivery.reply import Reply
from tasklease.worker.handlers.attempt import Attempt
from tasklease.worker.handlers.router import Router
from tasklease.worker.observe import telemetry
from tasklease.worker.observe.logs import note_error
from tasklease.worker.stores.base.fan_ins import FanInStore
from tasklease.worker.stores.base.retries import retry_while_unavailable
from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["Finisher", "store_unavailable"]

_log = logging.getLogger("tasklease.execution")


def store_unavailable(
    message: str, run_id: str | None, outcome: Outcome = Outcome.UNAVAILABLE
) -> Reply:
    """The answer when the store could not be reached: nothing was recorded."""
    return Reply.of(outcome, message, run_id)


class Finisher:
    """Records how each execution ended, only while its attempt still holds the claim."""

    def __init__(
        self,
        store: LeaseStore,
        clock: Callable[[], datetime],
        locks: ExecutionLocks,
        router: Router,
    ) -> None:
        self.store = store
        self.clock = clock
        self.locks = locks
        self.router = router
        self.fan_ins = FanIns(store, router, clock)

    def end(self, live: Attempt, ending: Ending, exc: BaseException, body: bytes) -> Reply:
        """Write ``ending`` (any but :attr:`Action.COMPLETE`, which only the path that holds
        the result can write) for the handler run that raised ``exc``, and answer.
        ``exc`` is raised again once written where the ending says so (KeyboardInterrupt)."""
        if ending.action is Action.FAIL:
            return self.fail(live, ending.reason, body)
        if ending.action is Action.GIVE_BACK:
            self.give_back(live, ending.reason, count=ending.counts)
            return Reply.of(ending.outcome, ending.message, live.run_id)
        if ending.action is Action.CHECK_COMMIT:
            return self._commit_unknown(live, ending)
        # A completion is written by the path that holds the result (complete, or the commit).
        assert ending.action is Action.RETRY, ending
        note_error(exc)  # Its stack trace goes into the request's one log line.
        limit = self._max_attempts(live)
        if limit is not None and live.number >= limit and not ending.reraise:
            # The last attempt allowed: a dead letter now, not on a claim after it, which a
            # queue whose own max attempts is the same number never makes.
            return self.fail(
                live, f"gave up after {limit} attempts (max_attempts): {ending.reason}", body
            )
        reply = self.release(live, ending.reason, ending.message)
        if ending.reraise:
            raise exc  # The process is being stopped: its run was given back first.
        return reply

    def complete(self, live: Attempt, result_json: str | None) -> Reply:
        """Record the run as completed with ``result_json``, as :meth:`finish` does (a fan-in
        child counted in its join in the same write)."""
        reply = Reply.of(Outcome.PROCESSED, "processed", live.run_id, result_json=result_json)
        keep_for = self.retention(live)
        store = self.store
        if isinstance(store, FanInStore) and live.fan_in is not None:
            member = live.fan_in
            return self._finish_member(
                live,
                member,
                lambda: store.complete_member(
                    member, live.run_id, live.attempt_id, result_json, self.clock, keep_for=keep_for
                ),
                reply,
            )
        return self.finish(
            live,
            lambda: store.complete(
                live.run_id, live.attempt_id, result_json, self.clock, keep_for=keep_for
            ),
            reply,
        )

    def cancel(self, live: Attempt, message: str, *, by: str | None = None) -> Reply:
        """End the run ``cancelled`` (never retried), as :meth:`finish` does: a run this
        attempt found marked, or (``by``) one whose parent was cancelled. A fan-in child
        counts in its join, as failed, in the same write."""
        reply = Reply.of(
            Outcome.CANCELLED, message, live.run_id, {"status": RunStatus.CANCELLED.value}
        )
        keep_for = self.retention(live)
        store = self.store
        if isinstance(store, FanInStore) and live.fan_in is not None:
            member = live.fan_in
            return self._finish_member(
                live,
                member,
                lambda: store.end_cancelled_member(
                    member, live.run_id, live.attempt_id, self.clock, keep_for=keep_for, by=by
                ),
                reply,
            )
        return self.finish(
            live,
            lambda: store.end_cancelled(
                live.run_id, live.attempt_id, self.clock, keep_for=keep_for, by=by
            ),
            reply,
        )

    def release(self, live: Attempt, error: str, message: str) -> Reply:
        """Release the run for a retry, counting the attempt, keeping ``error``; answer
        ``released`` with ``message`` once recorded, as :meth:`finish` does."""
        return self.finish(
            live,
            lambda: self.store.release(
                live.run_id, live.attempt_id, error, self.clock, keep_for=self.retention(live)
            ),
            Reply.of(Outcome.RELEASED, message, live.run_id),
        )

    def fail(self, live: Attempt, error: str, body: bytes) -> Reply:
        """Record the run as failed (a dead letter keeping ``body``), as :meth:`finish` does
        (a fan-in child counted in its join, as failed, in the same write)."""
        payload = body.decode("utf-8", errors="backslashreplace")
        reply = Reply.of(Outcome.FAILED, error, live.run_id, {"status": "failed"})
        keep_for = self.retention(live)
        store = self.store
        if isinstance(store, FanInStore) and live.fan_in is not None:
            member = live.fan_in
            return self._finish_member(
                live,
                member,
                lambda: store.fail_member(
                    member,
                    live.run_id,
                    live.attempt_id,
                    error,
                    self.clock,
                    payload=payload,
                    keep_for=keep_for,
                ),
                reply,
            )
        return self.finish(
            live,
            lambda: store.fail(
                live.run_id, live.attempt_id, error, self.clock, payload, keep_for=keep_for
            ),
            reply,
        )

    def _finish_member(
        self,
        live: Attempt,
        member: Member,
        write: Callable[[], Progress | None],
        reply: Reply,
    ) -> Reply:
        """:meth:`finish` with a write that counts the child in its join; then the join
        closed, if this finish (or an earlier one) filled it."""
        progress: list[Progress] = []

        def counted() -> bool:
            written = write()
            if written is None:
                return False
            progress[:] = [written]
            return True

        answered = self.finish(live, counted, reply)
        if answered is not reply or not progress:
            return answered
        return self.fan_ins.closed(member, progress[0], reply)

    def give_back(self, live: Attempt, error: str, *, count: bool = True) -> None:
        """Release a claim this attempt will not use, if it still holds it (best effort: a
        lease that runs out does the same, later). ``count=False``: the handler never ran,
        the attempt does not count. Its lock, if any, is released first."""
        try:
            self.locks.release(live)
            if not count:
                self.store.yield_claim(live.run_id, live.attempt_id, error, self.clock)
                return
            self.store.release(
                live.run_id, live.attempt_id, error, self.clock, keep_for=self.retention(live)
            )
        except StoreUnavailable:
            _log.warning("run %s: could not release attempt %s", live.run_id, live.attempt_id)

    def finish(self, live: Attempt, write: Callable[[], bool], reply: Reply) -> Reply:
        """Record how the execution ended, only while this attempt still holds the claim.

        A retried write that finds its own earlier try landed counts as done (the store
        recognises it by attempt id). The lock the attempt holds is released first, fenced:
        if another run took it, this attempt's lease lapsed while it ran, and its outcome is
        refused like that of a run taken over.
        """
        lock = live.lock
        try:
            released = self.locks.release(live)
        except StoreUnavailable as exc:
            # Whether another run took the lock is unknown: the record stays in progress
            # until its lease expires, as when the outcome's own write fails.
            return store_unavailable(
                f"could not tell whether the lock {lock} was released ({reply.outcome.value} "
                f"not recorded): {exc}",
                live.run_id,
                Outcome.UNRECORDED,
            )
        if not released:
            self.give_back(live, f"the lock {lock} was taken over by another run while it ran")
            return Reply.of(
                Outcome.LOST_CLAIM,
                f"the lock {lock} was taken over by another run; "
                f"this attempt's {reply.outcome.value} outcome was not recorded",
                live.run_id,
            )

        def write_once() -> bool:
            with telemetry.step("finish"):
                return write()

        try:
            held = retry_while_unavailable(write_once, live.timing.sleep)
        except StoreUnavailable as exc:
            # The record stays in progress until its lease expires; then a retry runs.
            return store_unavailable(
                f"could not record the outcome ({reply.outcome.value}): {exc}",
                live.run_id,
                Outcome.UNRECORDED,
            )
        if not held:
            # Another attempt took over after this one's lease expired: it owns the record now,
            # and a retry will see its outcome. Never overwrite it.
            return Reply.of(
                Outcome.LOST_CLAIM,
                "the lease was taken over by another attempt; "
                f"this attempt's {reply.outcome.value} outcome was not recorded",
                live.run_id,
            )
        return reply

    def _max_attempts(self, live: Attempt) -> int | None:
        spec = self.router.handler(Kind(live.kind), live.handler)
        return spec.max_attempts if spec is not None else None

    def retention(self, live: Attempt) -> timedelta | None:
        """The retention of the handler the attempt runs, to keep its record that long after a
        finish (a run can outlive the retention counted from its claim)."""
        spec = self.router.handler(Kind(live.kind), live.handler)
        return spec.retention if spec is not None else None

    def _commit_unknown(self, live: Attempt, ending: Ending) -> Reply:
        """The database failed during the transaction: its record tells whether it committed."""
        try:
            record = retry_while_unavailable(lambda: self.store.get(live.run_id), live.timing.sleep)
        except StoreUnavailable as exc:
            # In progress until its lease expires; then a retry finds the record or runs again.
            return Reply.of(
                Outcome.UNRECORDED,
                f"the transaction's outcome is unknown ({ending.cause}); "
                f"the record unreadable: {exc}",
                live.run_id,
            )
        if decisions.finished_by(record, live.attempt_id, RunStatus.COMPLETED):
            assert record is not None
            return Reply.of(
                Outcome.PROCESSED, "processed", live.run_id, result_json=record.result_json
            )
        self.give_back(live, ending.reason)
        return Reply.of(ending.outcome, ending.message, live.run_id)
