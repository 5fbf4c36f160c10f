"""What a store's transactional completion shares across backends: the checks made inside
the transaction, and the exceptions that end it without keeping anything.

A Spanner or Firestore transaction function that returns normally commits what it buffered,
so each way out that must keep nothing raises one of these through the client's transaction
runner, which rolls the transaction back. A transactional step shares them too.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol

from tasklease.errors import StoreUnavailable
from tasklease.worker.core import decisions, steps
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.core.steps import StepError, StepRecord


class ReadsRuns(Protocol):
    """What reads a run's record outside any transaction: a store, or a store's runs."""

    def get(self, run_id: str) -> RunRecord | None: ...


class NotHeld(Exception):
    """The attempt no longer holds the claim: roll back, keep nothing."""


class AlreadyCompleted(Exception):
    """This attempt's completion is committed already (an earlier call's commit landed,
    though its answer was lost): roll back this one, the effect is there. The outcome then
    gives the stored result, and ``tries`` 0 when ``work`` did not run in this call."""

    def __init__(self, record: RunRecord) -> None:
        super().__init__(record.run_id)
        self.record = record


class WorkRaised(Exception):
    """The handler's ``work`` raised ``error``: carried out of the transaction (rolled back)
    so the store's error mapping never mistakes it for the database's."""

    def __init__(self, error: Exception) -> None:
        super().__init__(repr(error))
        self.error = error


def held(record: RunRecord | None, run_id: str, attempt_id: str) -> RunRecord:
    """``record``, read in the transaction, if ``attempt_id`` holds it; else raise
    :class:`AlreadyCompleted` (its own completion is there) or :class:`NotHeld`."""
    if record is not None and decisions.finished_by(record, attempt_id, RunStatus.COMPLETED):
        raise AlreadyCompleted(record)
    if record is None or not decisions.holds(record, attempt_id):
        raise NotHeld(run_id)
    return record


def completion(
    record: RunRecord, result_json: str | None, at: datetime, keep_for: timedelta | None
) -> RunRecord:
    """The completed record to write in the transaction, kept ``keep_for`` after ``at``."""
    return decisions.kept(decisions.completed(record, result_json, at), at, keep_for)


def completed_by(record: RunRecord | None, attempt_id: str) -> RunRecord | None:
    """``record`` if it shows ``attempt_id`` completed the run, else None."""
    return record if decisions.finished_by(record, attempt_id, RunStatus.COMPLETED) else None


def with_step(record: RunRecord, step: StepRecord) -> RunRecord:
    """``record`` with ``step`` added; a step past the run's cap (``StepError``) carried in
    :class:`WorkRaised`, so the transaction rolls back with the step's writes."""
    try:
        return steps.with_step(record, step)
    except StepError as exc:
        raise WorkRaised(exc) from exc


def step_landed(
    store: ReadsRuns, run_id: str, attempt_id: str, written: list[StepRecord]
) -> StepRecord | None:
    """The step last ``written`` if the run's record shows it recorded by ``attempt_id``;
    None if not, or the record is unreadable."""
    if not written:
        return None
    try:
        landed = steps.steps_of(store.get(run_id)).get(written[-1].name)
    except StoreUnavailable:
        return None
    return landed if landed is not None and landed.attempt_id == attempt_id else None
