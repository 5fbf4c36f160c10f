"""What an operator does to runs and locks: list, show, find stuck ones, release, replay.

One service that ``tasklease runs``, ``tasklease locks`` and the dashboard call, so a button
and a command do the same thing. The rules are in :mod:`tasklease.worker.decisions` and
:mod:`tasklease.worker.locking`, the storage in the stores.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tasklease.worker import decisions, locking
from tasklease.worker.execution import utc_now
from tasklease.worker.identity import DeliveryIdentity, Kind
from tasklease.worker.queries import RunFilter, RunPage, is_stuck
from tasklease.worker.records import LockRecord, RunRecord
from tasklease.worker.schedules import DEFAULT_GRACE, OverdueJob, Schedule, overdue_jobs
from tasklease.worker.stores.base import LeaseStore

if TYPE_CHECKING:
    from tasklease.producer import Producer

REPLAY_KEY_PREFIX = "replay/"

_log = logging.getLogger("tasklease.operations")
_log.addHandler(logging.NullHandler())  # A library's logger: the application configures output.


class OperationRefused(Exception):
    """The operation does not apply to this run; the message says why."""


@dataclass(frozen=True)
class StuckReport:
    """In-progress runs whose lease expired, and scheduled jobs that missed their slot."""

    runs: list[RunRecord] = field(default_factory=list)
    jobs: list[OverdueJob] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.runs and not self.jobs


@dataclass(frozen=True)
class ReplayResult:
    """A replay: the task created (``created`` False: an earlier replay had created it) and
    the run it becomes, linked both ways."""

    run_id: str
    replay_run_id: str
    task_name: str
    created: bool


@dataclass(frozen=True)
class LockView:
    """A stored lock as an operator sees it at a moment: its state, until when it keeps other
    runs out (None: it does not), and its holder's run record when it has a holder."""

    lock: LockRecord
    holder_run: RunRecord | None
    state: locking.LockState
    busy_until: datetime | None


def replay_key(run_id: str) -> str:
    """The producer key of ``run_id``'s replay: one task, however often it is replayed."""
    return REPLAY_KEY_PREFIX + run_id


class Operations:
    """Operator actions on ``store``. ``producer`` (or a factory, called on first replay)
    re-enqueues replays; ``clock`` gives the time."""

    def __init__(
        self,
        store: LeaseStore,
        producer: Producer | Callable[[], Producer] | None = None,
        *,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.store = store
        self._producer = producer
        self.clock = clock

    def producer(self) -> Producer:
        from tasklease.producer import Producer  # noqa: PLC0415 - only replays need the producer.

        if self._producer is None:
            self._producer = Producer.from_env
        if not isinstance(self._producer, Producer):
            try:
                self._producer = self._producer()
            except ValueError as exc:
                raise OperationRefused(
                    f"cannot replay: the producer is not configured: {exc}"
                ) from exc
        return self._producer

    def list_runs(
        self, filters: RunFilter | None = None, limit: int = 50, cursor: str | None = None
    ) -> RunPage:
        return self.store.query_runs(filters, limit, cursor)

    def show(self, reference: str) -> RunRecord | None:
        """The run with this id, else the newest run of the task with this name."""
        record = self.store.get(reference)
        if record is None:
            found = self.store.find_runs(task_name=reference)
            record = found[0] if found else None
        return record

    def stuck(
        self,
        schedules: list[Schedule] | None = None,
        grace: timedelta = DEFAULT_GRACE,
        limit: int = 100,
    ) -> StuckReport:
        now = self.clock()
        runs = self.store.query_runs(RunFilter(stuck_at=now), limit).runs
        jobs = overdue_jobs(self.store, schedules, now, grace) if schedules else []
        return StuckReport(runs, jobs)

    def release(self, run_id: str, force: bool = False) -> decisions.OperatorRelease:
        """Give a run's claim back; refused while its lease is live unless ``force``."""
        return self.store.operator_release(run_id, self.clock, force=force)

    def locks(self, limit: int = 100) -> list[LockView]:
        """The stored locks, latest start first, each with its state now."""
        now = self.clock()
        return [self.lock_view(lock, now) for lock in self.store.list_locks(limit)]

    def lock_view(self, lock: LockRecord, now: datetime) -> LockView:
        """``lock`` at ``now``, its holder's run read (a released lock has none)."""
        holder = None if lock.released else self.store.get(lock.holder_run_id)
        return LockView(
            lock,
            holder,
            locking.state(lock, holder, now),
            locking.kept_out_until(lock, holder, now),
        )

    def release_lock(self, name: str, force: bool = False) -> locking.OperatorLockRelease:
        """Free the lock ``name`` for the next run; refused while its holder's lease is live
        unless ``force`` (the holder then loses its lease). Logged as an operator action."""
        decision = self.store.operator_release_lock(name, self.clock, force=force)
        if decision.outcome is locking.LockReleaseOutcome.RELEASED and decision.lock:
            _log.log(
                logging.WARNING if decision.forced else logging.INFO,
                "an operator released lock %r held by run %s (attempt %s)%s",
                name,
                decision.lock.holder_run_id,
                decision.lock.holder_attempt_id,
                f", forced while its lease was live until {decision.live_until.isoformat()}"
                if decision.forced and decision.live_until
                else "",
            )
        return decision

    def replay(self, run_id: str) -> ReplayResult:
        """Re-enqueue a failed run's payload as a new task keyed by the old run id.

        Its run's record is written first (released, linked to the old run), then the task is
        created, then the old run is linked to it: a replay that stopped half way is finished
        by replaying again, and however often it is replayed, Cloud Tasks' name
        de-duplication keeps it one task (for as long as it remembers the name, up to 24 h;
        the link on the old run tells a later reader it was replayed).
        """
        now = self.clock()
        record = self.store.get(run_id)
        refusal = decisions.replay_refusal(record, now)
        if refusal is not None:
            raise OperationRefused(f"run {run_id}: {refusal}")
        assert record is not None and record.payload is not None
        producer = self.producer()
        from tasklease.producer import task_id  # noqa: PLC0415

        key = replay_key(run_id)
        queue = record.identity.get("queue") or producer.queue
        identity = DeliveryIdentity(
            Kind.TASK,
            record.handler,
            project=producer.project,
            location=producer.location,
            queue=queue,
            task_name=task_id(record.handler, key),
        )
        self.store.add_replay(
            decisions.replay_pending(record, identity.run_id, identity.fields(), now)
        )
        result = producer.enqueue(record.handler, json.loads(record.payload), key, queue=queue)
        self.store.mark_replayed(run_id, identity.run_id)
        return ReplayResult(run_id, identity.run_id, result.name, result.created)


def run_summary(record: RunRecord, now: datetime) -> dict[str, Any]:
    """A run as JSON for ``--json`` and the dashboard: everything but payload and result
    bodies (their sizes only)."""
    duration = None if record.finished_at is None else (record.finished_at - record.claimed_at)
    return {
        "run_id": record.run_id,
        "kind": record.kind,
        "handler": record.handler,
        "status": record.status.value,
        "stuck": is_stuck(record, now),
        "attempts": record.attempts,
        "fencing_token": record.fencing_token,
        "attempt_id": record.attempt_id,
        "caller": record.caller,
        "claimed_at": _time(record.claimed_at),
        "lease_expires": _time(record.lease_expires),
        "finished_at": _time(record.finished_at),
        "duration_seconds": None if duration is None else duration.total_seconds(),
        "expire_at": _time(record.expire_at),
        "identity": dict(record.identity),
        "error": record.error,
        "result_bytes": None if record.result_json is None else len(record.result_json.encode()),
        "payload_bytes": None if record.payload is None else len(record.payload.encode()),
        "replay_of": record.replay_of,
        "replayed_as": record.replayed_as,
    }


def lock_summary(view: LockView) -> dict[str, Any]:
    """A lock as JSON for ``tasklease locks --json``."""
    lock, holder = view.lock, view.holder_run
    return {
        "name": lock.name,
        "state": view.state.value,
        "busy_until": _time(view.busy_until),
        "holder_run_id": lock.holder_run_id,
        "holder_attempt_id": lock.holder_attempt_id,
        "holder_run_status": None if holder is None else holder.status.value,
        "fencing_token": lock.fencing_token,
        "started_at": _time(lock.started_at),
        "lease_expires": _time(lock.lease_expires),
        "safety_expires": _time(lock.safety_expires),
        "next_start_at": _time(lock.next_start_at),
        "released_at": _time(lock.released_at),
    }


def _time(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")
