"""Fan-in on the delivery side: a child's finish counted in its join, and the ``then`` task
enqueued when the join closes (unless the join's parent run was cancelled).

Whoever sees a join closed with no ``then`` task noted enqueues it (under a name derived
from the join: one task however many try) and then notes it. A child whose finish landed
but whose ``then`` enqueue failed is answered 503: the queue delivers it again, and that
duplicate (answered from its record) counts it again (a no-op) and enqueues. So nothing
between a child's record and the ``then`` task depends on one process surviving.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from tasklease import joins, protocol
from tasklease.joins import Member
from tasklease.worker.core import cancellation
from tasklease.worker.core import fan_in as rules
from tasklease.worker.core.fan_in import ChildEntry, FanInRecord, Progress
from tasklease.worker.core.identity import Kind
from tasklease.worker.core.outcome import Outcome
from tasklease.worker.delivery.reply import Reply
from tasklease.worker.handlers.router import Router
from tasklease.worker.observe.logs import note_error
from tasklease.worker.stores.base.fan_ins import FanInStore
from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["FanIns", "then_payload"]

_log = logging.getLogger("tasklease.execution")

# The then task's body stays this far under Cloud Tasks' limit (its headers and URL count).
_PAYLOAD_ROOM = protocol.MAX_TASK_BYTES - 64 * 1024


def then_payload(
    join: FanInRecord, entries: list[ChildEntry], *, room: int = _PAYLOAD_ROOM
) -> dict[str, Any]:
    """The ``then`` handler's payload: every child's entry for a join of up to
    :data:`~tasklease.worker.core.fan_in.MAX_INLINE_RESULTS` children whose results fit in one
    task, else the first page that fits; ``next_after`` is then the key to page on from
    (``ctx.fan_in_results(after=...)``), None when ``results`` holds them all."""
    results = [entry.as_result() for entry in entries[: rules.MAX_INLINE_RESULTS]]
    while True:
        more = len(results) < join.expected
        payload = {
            "join_id": join.join_id,
            "parent_run_id": join.parent_run_id,
            "summary": {"total": join.expected, "completed": join.completed, "failed": join.failed},
            "results": results,
            "next_after": results[-1]["key"] if more and results else None,
        }
        if more and not results:
            payload["next_after"] = ""  # Page from the start.
        if len(json.dumps(payload, separators=(",", ":")).encode()) <= room or not results:
            return payload
        results = results[: len(results) // 2]


class FanIns:
    """Counts a delivery's child in its join and closes the join (see the module)."""

    def __init__(self, store: LeaseStore, router: Router, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.router = router
        self.clock = clock

    def refusal(self, member: Member | None) -> Reply | None:
        """The answer to a child delivery this store cannot count (before any claim: nothing
        is lost, the queue keeps it until a store that keeps joins serves it), or None."""
        if member is None or isinstance(self.store, FanInStore):
            return None
        return Reply.of(
            Outcome.ERROR,
            f"this task is a child of a fan-out with then=, and {self.store!r} keeps no joins: "
            "use a store that does (every store tasklease ships)",
        )

    def closed(self, member: Member, progress: Progress, reply: Reply) -> Reply:
        """``reply`` once the ``then`` task of a join this child's finish closed exists; a 503
        (retried, and counted again as a no-op) if it could not be enqueued."""
        if not progress.closed or progress.then_enqueued:
            return reply
        return self._enqueue_then(member, reply)

    def recount(
        self,
        member: Member,
        run_id: str,
        reply: Reply,
        keep_for: timedelta | None,
        *,
        counted_with_record: bool = True,
    ) -> Reply:
        """For a finished child's duplicate: close its join if that is still due. A child
        whose final record may have been written without its count (``counted_with_record``
        false: a transactional handler's, written in the handler's own transaction) is
        counted first (a no-op when it was); any other counted with its record."""
        store = self.store
        assert isinstance(store, FanInStore)
        try:
            progress = store.fan_in_progress(member.join_id)
            if progress is not None and progress.then_enqueued:
                return reply
            if progress is None or not counted_with_record:
                progress = store.count_member(member, run_id, self.clock, keep_for=keep_for)
        except Exception as exc:  # Any failure: the queue retries the child.
            return self._unsettled(member, reply, exc)
        return self.closed(member, progress, reply)

    def _enqueue_then(self, member: Member, reply: Reply) -> Reply:
        store = self.store
        assert isinstance(store, FanInStore)
        try:
            join = store.get_fan_in(member.join_id)
            if join is None or join.then_enqueued_at is not None:
                return reply
            if cancellation.is_cancelled(store.get(join.parent_run_id)):
                _log.info(
                    "fan-in %s closed; its parent run %s was cancelled: %s not enqueued",
                    member.join_id,
                    join.parent_run_id,
                    member.then,
                    extra={"json_fields": {"join_id": member.join_id, "then": member.then}},
                )
                return reply
            entries = store.fan_in_entries(member.join_id, limit=rules.MAX_INLINE_RESULTS)
            self._create_then(join, then_payload(join, entries))
            store.mark_then_enqueued(member.join_id, self.clock())
        except Exception as exc:
            return self._unsettled(member, reply, exc)
        _log.info(
            "fan-in %s closed: %s enqueued (%d children)",
            member.join_id,
            member.then,
            member.expected,
            extra={"json_fields": {"join_id": member.join_id, "then": member.then}},
        )
        return reply

    def _create_then(self, join: FanInRecord, payload: dict[str, Any]) -> None:
        spec = self.router.handler(Kind.TASK, join.then)
        options: dict[str, Any] = {"headers": {protocol.FAN_IN_OF_HEADER: join.join_id}}
        if spec is not None:
            options["queue"] = spec.queue
            if spec.audience:
                options["audience"] = spec.audience
        self.router.producer().enqueue(join.then, payload, joins.then_key(join.join_id), **options)

    def _unsettled(self, member: Member, reply: Reply, exc: BaseException) -> Reply:
        note_error(exc)
        return Reply.of(
            Outcome.UNAVAILABLE,
            f"{reply.message}; the fan-in {member.join_id} could not be settled "
            f"({type(exc).__name__}: {exc}): a retry settles it",
            reply.run_id,
        )
