"""A transactional handler's writes and its run's completion, in one Spanner read-write
transaction (:class:`~tasklease.worker.stores.base.transactional.TransactionalStore`).

The transaction runs the handler's ``work`` with the ``Transaction`` (its mutations and DML)
first, then reads the run's row, checks that the attempt still holds the claim, and buffers
the completed record. The row is read last so that the handler's transaction holds no lock on
it while the handler runs: the attempt's lease keeper renews the run (a read-write transaction
on that row) every ``lease / 3``, and a renewal meeting the handler's lock aborted the handler's
transaction, which then ran again, every renewal. A read in a read-write transaction locks
the row until the commit, so no takeover can commit between the check and the commit.
RPCs: the handler's own statements (the first begins the transaction inline), the row's
read, the Commit: 2 beyond the handler's.

Spanner aborts a transaction under contention; it then runs again from the start, ``work``
included (counted in :attr:`TransactionOutcome.tries`). A transaction function that returns
normally commits what it buffered, so every way out that must keep nothing (the claim gone,
``work`` raised) raises (:mod:`.transaction_exits`) through ``run_in_transaction``, which rolls
it back.

A try run again after an abort first reads the run's row outside the transaction (a strong
read, which locks nothing): a commit that landed though its call failed, or a takeover, ends
the call there, without running ``work`` again.

Google's Spanner emulator runs one read-write transaction at a time, whatever rows it
touches: another one aborts either itself or the one in progress. While a handler's
transaction is open, the store's lease renewals for that attempt are therefore read-only on
the emulator (:class:`OpenTransactions`; see :meth:`SpannerStore.renew`).

A transactional step (``ctx.step(..., transactional=True)``) runs in the same kind of
transaction: the step's function with the ``Transaction`` first, then the row's read and the
claim's check, then the row with the step added (:meth:`SpannerTransactions.record_step`). RPCs
the same: 2 beyond the step's own statements.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

from google.api_core import exceptions as api

from tasklease.errors import StoreUnavailable
from tasklease.plumbing.spanner_calls import FIRST_PAUSE, MAX_PAUSE, contended
from tasklease.worker.core import decisions
from tasklease.worker.core.records import RunRecord
from tasklease.worker.core.steps import StepRecord
from tasklease.worker.stores.base.google_handler_transaction import GoogleTransaction
from tasklease.worker.stores.base.store import Moment, resolve
from tasklease.worker.stores.base.transaction_exits import (
    AlreadyCompleted,
    NotHeld,
    WorkRaised,
    completed_by,
    completion,
    held,
    step_landed,
    with_step,
)
from tasklease.worker.stores.base.transactional import StepWork, TransactionOutcome, Work
from tasklease.worker.stores.spanner.runs import Database, SpannerRuns

_T = TypeVar("_T")
# Tries of one transactional completion before it reports contention (Firestore's client
# makes 5 attempts at a Commit).
MAX_TRIES = 8


class SpannerTransactions:
    """The read-write transactions that hold a handler's (or a step's) writes with its run's
    row, in ``runs``' table of the database ``database`` gives
    (:class:`~tasklease.worker.stores.base.transactional.TransactionalStore`'s two methods).
    """

    def __init__(self, database: Database, runs: SpannerRuns) -> None:
        self._database = database
        self._runs = runs
        self.open = OpenTransactions()

    def is_open(self, attempt_id: str) -> bool:
        """Whether ``attempt_id``'s handler or step transaction is open in this process."""
        return attempt_id in self.open

    def complete(
        self,
        run_id: str,
        attempt_id: str,
        work: Work,
        now: Moment,
        *,
        keep_for: timedelta | None,
    ) -> TransactionOutcome:
        """``work``'s writes and the run completed by ``attempt_id``, in one transaction."""
        runs = self._runs
        tries = 0

        def attempt(transaction: Any) -> str | None:
            nonlocal tries
            tries += 1
            result_json = guarded_work(work, transaction)
            # Read last: the handler ran holding no lock on the run's row (see the module's doc).
            record = held(runs.read(transaction, run_id), run_id, attempt_id)
            runs.write(transaction, completion(record, result_json, resolve(now), keep_for))
            return result_json

        def before_rerun() -> None:
            held(runs.get(run_id), run_id, attempt_id)

        database = self._database()
        raised: Exception | None = None
        try:
            with self.open.holding(attempt_id):
                result = rerun_on_contention(database, attempt, run_id, before_rerun)
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
            landed = read_back(runs, run_id, attempt_id)
            if landed is not None:
                return TransactionOutcome(held=True, result_json=landed.result_json, tries=tries)
            raise StoreUnavailable(
                f"Spanner store: could not complete run {run_id} in a transaction: {exc}"
            ) from exc
        else:
            return TransactionOutcome(held=True, result_json=result, tries=tries)
        # Raised outside the except clause: the handler's own exception, its chain untouched.
        raise raised

    def record_step(self, run_id: str, attempt_id: str, step_work: StepWork) -> TransactionOutcome:
        """``step_work``'s writes and the step it returns added to the run, in one
        transaction."""
        runs = self._runs
        tries = 0
        written: list[StepRecord] = []

        def attempt(transaction: Any) -> StepRecord:
            nonlocal tries
            tries += 1
            step = guarded_work(step_work, transaction)
            written.append(step)
            # Read last, as a handler's completion does: no lock on the row while the step runs.
            record = _held_for_a_step(runs.read(transaction, run_id), run_id, attempt_id)
            runs.write(transaction, with_step(record, step))
            return step

        def before_rerun() -> None:
            _held_for_a_step(runs.get(run_id), run_id, attempt_id)

        raised: Exception | None = None
        try:
            with self.open.holding(attempt_id):
                step = rerun_on_contention(self._database(), attempt, run_id, before_rerun)
        except NotHeld:
            return TransactionOutcome(held=False, result_json=None, tries=tries)
        except WorkRaised as carrier:
            raised = carrier.error
        except StoreUnavailable:
            raise  # Contention outlasted every try: nothing was committed.
        except (api.GoogleAPIError, ValueError, OSError, TimeoutError) as exc:
            # The Commit may have landed before its call failed: the record tells.
            landed = step_landed(runs, run_id, attempt_id, written)
            if landed is not None:
                return TransactionOutcome(held=True, result_json=landed.result_json, tries=tries)
            raise StoreUnavailable(
                f"Spanner store: could not record a step of run {run_id} in a transaction: {exc}"
            ) from exc
        else:
            return TransactionOutcome(held=True, result_json=step.result_json, tries=tries)
        raise raised  # The step's own exception, outside the except clause: its chain untouched.


def _held_for_a_step(record: RunRecord | None, run_id: str, attempt_id: str) -> RunRecord:
    """``record`` if ``attempt_id`` holds it, else raise :class:`NotHeld`."""
    if not decisions.holds(record, attempt_id):
        raise NotHeld(run_id)
    assert record is not None  # holds() said so.
    return record


def rerun_on_contention(
    database: Any, attempt: Callable[[Any], _T], run_id: str, before_rerun: Callable[[], None]
) -> _T:
    """``run_transaction``'s loop, bounded by tries rather than by the store's call time:
    each try holds the handler's work, which may take longer than that on its own.
    ``before_rerun`` runs before each try but the first, outside any transaction; it raises
    to end the call without running the work again."""
    pause = FIRST_PAUSE
    for number in range(MAX_TRIES):
        if number:
            before_rerun()
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


class OpenTransactions:
    """The attempts of one store whose handler or step transaction is open in this process.

    Google's Spanner emulator runs one read-write transaction at a time: a second one either
    aborts itself or, by chance, the one in progress ("The emulator only allows one
    read-write transaction or schema change at a time", README of
    https://github.com/GoogleCloudPlatform/cloud-spanner-emulator; the lock manager aborts the
    current one with a probability of 20 per cent, backend/locking/manager.cc). An attempt's
    own lease renewal, run while its handler's transaction is open, would abort that
    transaction; the store asks here to leave it out.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()

    @contextmanager
    def holding(self, attempt_id: str) -> Iterator[None]:
        """Count ``attempt_id``'s transaction open for the ``with`` block."""
        with self._lock:
            self._open[attempt_id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._open[attempt_id] -= 1
                if not self._open[attempt_id]:
                    del self._open[attempt_id]

    def __contains__(self, attempt_id: object) -> bool:
        with self._lock:
            return attempt_id in self._open


def guarded_work(work: Callable[[Any], _T], transaction: Any) -> _T:
    """``work(transaction)``; its exceptions carried in :class:`WorkRaised`, but for
    contention (Spanner aborted the handler's statement), which runs the transaction again."""
    try:
        return work(GoogleTransaction(transaction))  # It may not commit or roll back.
    except Exception as exc:
        if contended(exc):
            raise
        raise WorkRaised(exc) from exc


def read_back(runs: SpannerRuns, run_id: str, attempt_id: str) -> RunRecord | None:
    """The run's record if it shows ``attempt_id`` completed it; None if not, or unreadable."""
    try:
        record = runs.get(run_id)
    except StoreUnavailable:
        return None
    return completed_by(record, attempt_id)
