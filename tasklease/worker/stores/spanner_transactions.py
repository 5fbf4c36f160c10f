"""A transactional handler's writes and its run's completion, in one Spanner read-write
transaction (:class:`~tasklease.worker.stores.transactional.TransactionalStore`).

The transaction reads the run's row first (a read in a read-write transaction locks it, so no
takeover can commit between the check and the commit), checks that the attempt still holds
the claim, runs the handler's ``work`` with the ``Transaction`` (its mutations and DML), then
buffers the completed record. RPCs: the row's read (which begins the transaction inline), the
handler's own statements, the Commit: 2 beyond the handler's.

Spanner aborts a transaction under contention; it then runs again from the start, ``work``
included (counted in :attr:`TransactionOutcome.tries`). A transaction function that returns
normally commits what it buffered, so every way out that must keep nothing (the claim gone,
``work`` raised) raises (:mod:`.transaction_exits`) through ``run_in_transaction``, which rolls
it back.

A transactional step (``ctx.step(..., transactional=True)``) runs in the same kind of
transaction: the row's read and the claim's check first, then the step's function with the
``Transaction``, then the row with the step added (:func:`record_step_in_transaction`). RPCs
the same: 2 beyond the step's own statements.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from google.api_core import exceptions as api

from tasklease.errors import StoreUnavailable
from tasklease.worker.core import decisions
from tasklease.worker.core.records import RunRecord
from tasklease.worker.core.steps import StepRecord
from tasklease.worker.stores import spanner_schema as schema
from tasklease.worker.stores.base import Moment, resolve
from tasklease.worker.stores.google_handler_transaction import GoogleTransaction
from tasklease.worker.stores.spanner_calls import FIRST_PAUSE, MAX_PAUSE, contended
from tasklease.worker.stores.transaction_exits import (
    AlreadyCompleted,
    NotHeld,
    WorkRaised,
    completed_by,
    completion,
    held,
    step_landed,
    with_step,
)
from tasklease.worker.stores.transactional import StepWork, TransactionOutcome, Work

if TYPE_CHECKING:
    from tasklease.worker.stores.spanner import SpannerStore

_T = TypeVar("_T")
# Tries of one transactional completion before it reports contention (Firestore's client
# makes 5 attempts at a Commit).
MAX_TRIES = 8


def complete_in_transaction(
    store: SpannerStore,
    run_id: str,
    attempt_id: str,
    work: Work,
    now: Moment,
    *,
    keep_for: timedelta | None,
) -> TransactionOutcome:
    """:meth:`TransactionalStore.complete_in_transaction` on ``store``."""
    tries = 0

    def attempt(transaction: Any) -> str | None:
        nonlocal tries
        record = held(store._read_run(transaction, run_id), run_id, attempt_id)
        tries += 1
        result_json = guarded_work(work, transaction)
        done = completion(record, result_json, resolve(now), keep_for)
        transaction.insert_or_update(store.table, schema.WRITE_COLUMNS, [store._row(done)])
        return result_json

    database = store.database
    raised: Exception | None = None
    try:
        result = rerun_on_contention(database, attempt, run_id)
    except NotHeld:
        return TransactionOutcome(held=False, result_json=None, tries=tries)
    except AlreadyCompleted as done:
        return TransactionOutcome(held=True, result_json=done.record.result_json, tries=tries)
    except WorkRaised as carrier:
        raised = carrier.error
    except StoreUnavailable:
        raise  # Contention outlasted every try: nothing was committed.
    except (api.GoogleAPIError, ValueError, OSError, TimeoutError) as exc:
        # The Commit may have landed before its call failed: the record tells.
        landed = read_back(store, run_id, attempt_id)
        if landed is not None:
            return TransactionOutcome(held=True, result_json=landed.result_json, tries=tries)
        raise StoreUnavailable(
            f"Spanner store: could not complete run {run_id} in a transaction: {exc}"
        ) from exc
    else:
        return TransactionOutcome(held=True, result_json=result, tries=tries)
    # Raised outside the except clause: the handler's own exception, its chain untouched.
    raise raised


def record_step_in_transaction(
    store: SpannerStore, run_id: str, attempt_id: str, step_work: StepWork
) -> TransactionOutcome:
    """:meth:`TransactionalStore.record_step_in_transaction` on ``store``."""
    tries = 0
    written: list[StepRecord] = []

    def attempt(transaction: Any) -> StepRecord:
        nonlocal tries
        record = store._read_run(transaction, run_id)
        if not decisions.holds(record, attempt_id):
            raise NotHeld(run_id)
        assert record is not None  # holds() said so.
        tries += 1
        step = guarded_work(step_work, transaction)
        written.append(step)
        recorded = with_step(record, step)
        transaction.insert_or_update(store.table, schema.WRITE_COLUMNS, [store._row(recorded)])
        return step

    raised: Exception | None = None
    try:
        step = rerun_on_contention(store.database, attempt, run_id)
    except NotHeld:
        return TransactionOutcome(held=False, result_json=None, tries=tries)
    except WorkRaised as carrier:
        raised = carrier.error
    except StoreUnavailable:
        raise  # Contention outlasted every try: nothing was committed.
    except (api.GoogleAPIError, ValueError, OSError, TimeoutError) as exc:
        # The Commit may have landed before its call failed: the record tells.
        landed = step_landed(store, run_id, attempt_id, written)
        if landed is not None:
            return TransactionOutcome(held=True, result_json=landed.result_json, tries=tries)
        raise StoreUnavailable(
            f"Spanner store: could not record a step of run {run_id} in a transaction: {exc}"
        ) from exc
    else:
        return TransactionOutcome(held=True, result_json=step.result_json, tries=tries)
    raise raised  # The step's own exception, outside the except clause: its chain untouched.


def rerun_on_contention(database: Any, attempt: Callable[[Any], _T], run_id: str) -> _T:
    """``run_transaction``'s loop, bounded by tries rather than by the store's call time:
    each try holds the handler's work, which may take longer than that on its own."""
    pause = FIRST_PAUSE
    for _ in range(MAX_TRIES):
        try:
            # timeout_secs=0: the client's own loop does not run it again (see run_transaction).
            result: _T = database.run_in_transaction(attempt, timeout_secs=0)
            return result
        except api.GoogleAPICallError as exc:
            if not contended(exc):
                raise
            last = exc
        time.sleep(random.uniform(pause / 2, pause))
        pause = min(pause * 2, MAX_PAUSE)
    raise StoreUnavailable(f"Spanner store: too much contention to complete run {run_id}") from last


def guarded_work(work: Callable[[Any], _T], transaction: Any) -> _T:
    """``work(transaction)``; its exceptions carried in :class:`WorkRaised`, but for
    contention (Spanner aborted the handler's statement), which runs the transaction again."""
    try:
        return work(GoogleTransaction(transaction))  # It may not commit or roll back.
    except Exception as exc:
        if contended(exc):
            raise
        raise WorkRaised(exc) from exc


def read_back(store: SpannerStore, run_id: str, attempt_id: str) -> RunRecord | None:
    """The run's record if it shows ``attempt_id`` completed it; None if not, or unreadable."""
    try:
        record = store.get(run_id)
    except StoreUnavailable:
        return None
    return completed_by(record, attempt_id)
