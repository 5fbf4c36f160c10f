"""What an operator does to runs and locks: list, show, find stuck ones, release, replay.

One service that ``tasklease runs``, ``tasklease locks`` and the dashboard call, so a button
and a command do the same thing. The rules are in :mod:`tasklease.worker.core.decisions` and
:mod:`tasklease.worker.core.locking`, the storage in the stores.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from tasklease.errors import TaskleaseError
from tasklease.jobs import Job
from tasklease.protocol import rfc3339_or_none
from tasklease.worker.core import decisions, fan_in, locking
from tasklease.worker.core.identity import DeliveryIdentity, Kind
from tasklease.worker.core.queries import RunFilter, RunPage, is_stuck
from tasklease.worker.core.records import LockRecord, RunRecord, RunStatus
from tasklease.worker.operate.run_ids import resolve_run_id
from tasklease.worker.operate.signals import SignalDecision, send_signal
from tasklease.worker.operate.stuck_schedules import DEFAULT_GRACE, OverdueJob, overdue_jobs
from tasklease.worker.runtime.clock import utc_now
from tasklease.worker.stores.base.fan_ins import FanInStore
from tasklease.worker.stores.base.locks import lock_store
from tasklease.worker.stores.base.queries import operator_queries
from tasklease.worker.stores.base.store import LeaseStore

if TYPE_CHECKING:
    from tasklease.producer import Producer

REPLAY_KEY_PREFIX = "replay/"

_log = logging.getLogger("tasklease.operations")
_log.addHandler(logging.NullHandler())  # A library's logger: the application configures output.


class OperationRefused(TaskleaseError):
    """The operation does not apply to this run; the message says why."""


class ProducerNotConfigured(OperationRefused):
    """A replay needs a producer, and the environment configures none (the message says
    what is missing): a failure of the setup, not a refusal of the run."""


@dataclass(frozen=True)
class StuckReport:
    """In-progress runs whose lease expired, and scheduled jobs that missed their slot."""

    runs: list[RunRecord] = field(default_factory=list)
    jobs: list[OverdueJob] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.runs and not self.jobs


class ReplayOutcome(StrEnum):
    """What a replay request did."""

    ENQUEUED = "enqueued"  # A new task now carries the payload.
    # An earlier request for this same replay had created its task (a double click, a
    # command retried after a lost answer): nothing new.
    ALREADY_ENQUEUED = "already_enqueued"
    PENDING = "pending"  # The run's latest replay has not finished: nothing enqueued.


@dataclass(frozen=True)
class ReplayResult:
    """A replay of ``run_id``: the run that carries its payload now (``replay_run_id``, with
    its status) and its task. ``replayed_run_id`` is the failed run whose payload was sent:
    ``run_id`` itself, or its latest replay when that one failed too."""

    run_id: str
    replay_run_id: str
    task_name: str
    created: bool
    outcome: ReplayOutcome
    replayed_run_id: str
    replay_status: str

    @property
    def summary(self) -> str:
        """What the replay did, in one sentence, for the command line and the dashboard."""
        if self.outcome is ReplayOutcome.PENDING:
            return (
                f"Already replayed: pending as run {self.replay_run_id} "
                f"({self.replay_status}); nothing enqueued."
            )
        of = (
            ""
            if self.replayed_run_id == self.run_id
            else f" of its latest replay {self.replayed_run_id}, which failed too,"
        )
        if self.outcome is ReplayOutcome.ALREADY_ENQUEUED:
            return (
                f"This replay{of} was already enqueued by an earlier request as task "
                f"{self.task_name}; its run: {self.replay_run_id} ({self.replay_status})."
            )
        return f"Replay{of} enqueued as task {self.task_name}; its run: {self.replay_run_id}."


@dataclass(frozen=True)
class LockView:
    """A stored lock as an operator sees it at a moment: its state, until when it keeps other
    runs out (None: it does not), and its holder's run record when it has a holder."""

    lock: LockRecord
    holder_run: RunRecord | None
    state: locking.LockState
    busy_until: datetime | None


def replay_key(run_id: str) -> str:
    """The producer key of ``run_id``'s replay: one task, however often that run is replayed.

    A replay that fails is replayed under its own run id, so each replay of a dead letter
    gets a task of its own while a repeated request for the same one does not.
    """
    return REPLAY_KEY_PREFIX + run_id


class Operations:
    """Operator actions on ``store`` (which must implement
    :class:`~tasklease.worker.stores.base.queries.OperatorQueries`, and
    :class:`~tasklease.worker.stores.base.locks.LockStore` for the lock actions). ``producer``
    (or a factory, called on first replay) re-enqueues replays; ``clock`` gives the time."""

    def __init__(
        self,
        store: LeaseStore,
        producer: Producer | Callable[[], Producer] | None = None,
        *,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.store = operator_queries(store, "operator actions")
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
                raise ProducerNotConfigured(
                    f"cannot enqueue: the producer is not configured: {exc}"
                ) from exc
        return self._producer

    def list_runs(
        self, filters: RunFilter | None = None, limit: int = 50, cursor: str | None = None
    ) -> RunPage:
        return self.store.query_runs(filters, limit, cursor)

    def resolve(self, reference: str) -> str:
        """The whole id of the run ``reference`` (an id or a unique prefix of at least 8
        characters) names; :class:`tasklease.worker.operate.run_ids.AmbiguousRunId` for a prefix
        several ids start with."""
        return resolve_run_id(self.store, reference)

    def fan_ins(self, run_id: str, children: int = 50) -> list[dict[str, Any]]:
        """The joins run ``run_id`` fanned out (``fan_out(..., then=...)``), each with up to
        ``children`` of its finished children (:func:`tasklease.worker.core.fan_in.summary`);
        none on a store that keeps no joins."""
        store = self.store
        if not isinstance(store, FanInStore):
            return []
        return [
            fan_in.summary(join, store.fan_in_entries(join.join_id, limit=children))
            for join in store.fan_ins_of(run_id)
        ]

    def show(self, reference: str) -> RunRecord | None:
        """The run with this id (or unique id prefix), else the newest run of the task with
        this name."""
        record = self.store.get(self.resolve(reference))
        if record is None:
            found = self.store.find_runs(task_name=reference)
            record = found[0] if found else None
        return record

    def stuck(
        self,
        schedules: list[Job] | None = None,
        grace: timedelta = DEFAULT_GRACE,
        limit: int = 100,
    ) -> StuckReport:
        now = self.clock()
        runs = self.store.query_runs(RunFilter(stuck_at=now), limit).runs
        jobs = overdue_jobs(self.store, schedules, now, grace) if schedules else []
        return StuckReport(runs, jobs)

    def release(
        self,
        run_id: str,
        force: bool = False,
        *,
        attempt_id: str | None = None,
        fencing_token: int | None = None,
    ) -> decisions.OperatorRelease:
        """Give a run's claim back; refused while its lease is live unless ``force``, and
        refused (``HOLDER_CHANGED``) unless the attempt the operator saw, ``attempt_id`` and
        ``fencing_token`` when given, still holds it."""
        return self.store.operator_release(
            run_id, self.clock, force=force, attempt_id=attempt_id, fencing_token=fencing_token
        )

    def locks(self, limit: int = 100) -> list[LockView]:
        """The stored locks, latest start first, each with its state now."""
        now = self.clock()
        return [self.lock_view(lock, now) for lock in lock_store(self.store).list_locks(limit)]

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
        decision = lock_store(self.store).operator_release_lock(name, self.clock, force=force)
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

    def signal(self, run_id: str, name: str, payload: Any = None) -> SignalDecision:
        """Send the signal ``name`` to the run (:func:`~tasklease.worker.operate.signals.
        send_signal`), its resume task through :meth:`producer` when it waits for it."""
        return send_signal(
            run_id, name, payload, store=self.store, producer=self.producer(), clock=self.clock
        )

    def replay(self, run_id: str, corrected_payload: str | None = None) -> ReplayResult:
        """Re-enqueue a failed run's payload as a new task keyed by the run it re-runs.

        A run already replayed is followed along its ``replayed_as`` links to its latest
        replay: while that one is pending or running, nothing is enqueued (the result says
        so); when it failed too, it is the one replayed, under its own key; when it
        completed, the replay is refused. The replay's record is written first (released,
        linked to the run it re-runs), then the task is created, then that run is linked to
        it: a replay that stopped half way is finished by the next request for it, which
        finds the same latest run and so the same key (Cloud Tasks' name de-duplication and
        the run id keep it one task and one run).

        ``corrected_payload`` (JSON text) is sent instead of the failed run's own: the replay
        gets a key (a task and run) of its own per payload, and its record says
        ``identity.replay_payload = corrected``.
        """
        now = self.clock()
        record = self.store.get(run_id)
        refusal = decisions.replay_refusal(record, now)
        if refusal is not None:
            raise OperationRefused(f"run {run_id}: {refusal}")
        assert record is not None
        latest = self._latest_replay(record, now)
        if latest.status in (RunStatus.RELEASED, RunStatus.IN_PROGRESS):
            return ReplayResult(
                run_id,
                latest.run_id,
                _task_path(latest.identity),
                created=False,
                outcome=ReplayOutcome.PENDING,
                replayed_run_id=latest.replay_of or run_id,
                replay_status=latest.status.value,
            )
        if latest is not record and latest.status is not RunStatus.FAILED:
            raise OperationRefused(
                f"run {run_id} was already replayed as run {latest.run_id}, which is "
                f"{latest.status.value}: nothing to replay"
            )
        refusal = decisions.replay_refusal(latest, now)
        if refusal is not None:
            raise OperationRefused(f"run {run_id}'s latest replay {latest.run_id}: {refusal}")
        return self._send(run_id, latest, now, corrected_payload)

    def _latest_replay(self, record: RunRecord, now: datetime) -> RunRecord:
        """``record``'s newest replay on record (``record`` itself if it has none)."""
        seen = {record.run_id}
        while record.replayed_as is not None and record.replayed_as not in seen:
            replay = self.store.get(record.replayed_as)
            if not decisions.is_live(replay, now):
                break  # Gone: its key is sent again, which finishes or renews it.
            assert replay is not None
            seen.add(replay.run_id)
            record = replay
        return record

    def _send(
        self, run_id: str, failed: RunRecord, now: datetime, corrected: str | None = None
    ) -> ReplayResult:
        assert failed.payload is not None
        producer = self.producer()
        from tasklease.producer import task_id  # noqa: PLC0415

        key = replay_key(failed.run_id)
        if corrected is not None:
            key += "/corrected-" + hashlib.sha256(corrected.encode()).hexdigest()[:16]
        queue = failed.identity.get("queue") or producer.queue
        identity = DeliveryIdentity(
            Kind.TASK,
            failed.handler,
            project=producer.project,
            location=producer.location,
            queue=queue,
            task_name=task_id(failed.handler, key),
        )
        fields = identity.fields()
        if corrected is not None:
            fields[decisions.REPLAY_PAYLOAD_FIELD] = "corrected"
        stored = self.store.add_replay(
            decisions.replay_pending(failed, identity.run_id, fields, now)
        )
        payload = json.loads(failed.payload if corrected is None else corrected)
        result = producer.enqueue(failed.handler, payload, key, queue=queue)
        self.store.mark_replayed(failed.run_id, identity.run_id)
        outcome = ReplayOutcome.ENQUEUED if result.created else ReplayOutcome.ALREADY_ENQUEUED
        return ReplayResult(
            run_id,
            identity.run_id,
            result.name,
            result.created,
            outcome,
            failed.run_id,
            stored.status.value,
        )


def _task_path(identity: dict[str, str]) -> str:
    """The Cloud Tasks name of a run's task, as the producer gives it (or the short ID when
    the run does not know its project or location)."""
    parts = [identity.get(name) for name in ("project", "location", "queue", "task_name")]
    if all(parts):
        return "projects/{}/locations/{}/queues/{}/tasks/{}".format(*parts)
    return identity.get("task_name", "")


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
        "claimed_at": rfc3339_or_none(record.claimed_at),
        "lease_expires": rfc3339_or_none(record.lease_expires),
        "finished_at": rfc3339_or_none(record.finished_at),
        "duration_seconds": None if duration is None else duration.total_seconds(),
        "expire_at": rfc3339_or_none(record.expire_at),
        "identity": dict(record.identity),
        "error": record.error,
        "result_bytes": None if record.result_json is None else len(record.result_json.encode()),
        "payload_bytes": None if record.payload is None else len(record.payload.encode()),
        "replay_of": record.replay_of,
        "replayed_as": record.replayed_as,
        "cancelled_by": record.cancelled_by,
        "cancelled_at": rfc3339_or_none(record.cancelled_at),
    }


def lock_summary(view: LockView) -> dict[str, Any]:
    """A lock as JSON for ``tasklease locks --json``."""
    lock, holder = view.lock, view.holder_run
    return {
        "name": lock.name,
        "state": view.state.value,
        "busy_until": rfc3339_or_none(view.busy_until),
        "holder_run_id": lock.holder_run_id,
        "holder_attempt_id": lock.holder_attempt_id,
        "holder_run_status": None if holder is None else holder.status.value,
        "fencing_token": lock.fencing_token,
        "started_at": rfc3339_or_none(lock.started_at),
        "lease_expires": rfc3339_or_none(lock.lease_expires),
        "safety_expires": rfc3339_or_none(lock.safety_expires),
        "next_start_at": rfc3339_or_none(lock.next_start_at),
        "released_at": rfc3339_or_none(lock.released_at),
    }
