"""A transactional handler's writes and its run's completion, in one Firestore transaction
(:class:`~tasklease.worker.stores.base.transactional.TransactionalStore`).

The transaction reads the run's document first (server clients use pessimistic transactions:
the read locks it, so no takeover can commit between the check and the commit), checks that
the attempt still holds the claim, runs the handler's ``work`` with the ``Transaction``, then
sets the completed record. Firestore wants every read of a transaction before its first write:
``work`` may read (``transaction.get``, ``ref.get(transaction=...)``) and then write, never read
after writing (the client raises). RPCs: BeginTransaction, the run's read, the handler's
reads, the Commit (its writes and the record together): 3 beyond the handler's reads.

Firestore aborts a transaction under contention; it then runs again from the start, ``work``
included (counted in :attr:`TransactionOutcome.tries`): ``@firestore.transactional`` runs it
again when the Commit aborts, and this module when a read does. Every way out that must keep
nothing (the claim gone, ``work`` raised) raises (:mod:`.transaction_exits`), and the
transaction is rolled back.

A transactional step (``ctx.step(..., transactional=True)``; :class:`FirestoreTransactions`)
runs in the same kind of transaction: the run's read and the claim's check first, then the
step's function with the ``Transaction``, then the run with the step added, in the same
Commit. RPCs the same: 3 beyond the step's own reads.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from google.api_core import exceptions as api
from google.api_core import retry as retries
from google.cloud import firestore

from tasklease.errors import StoreUnavailable
from tasklease.plumbing.rpc_deadlines import bound_rpcs
from tasklease.worker.core import decisions
from tasklease.worker.core.records import RunRecord
from tasklease.worker.core.steps import StepRecord
from tasklease.worker.stores.base.conditional_claims import RememberedWrites
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
from tasklease.worker.stores.firestore.codec import decode_run, encode_run
from tasklease.worker.stores.firestore.documents import FirestoreRuns

_T = TypeVar("_T")
# The RPCs a Transaction makes with the client's defaults, and what those retry by themselves.
_TRANSACTION_RPCS = ("begin_transaction", "commit", "rollback")
_TRANSIENT = retries.if_exception_type(api.ServiceUnavailable, api.ResourceExhausted)
# Transactions begun afresh after a read aborted (each one the client's own attempts at its
# Commit, five by default), before the call reports contention.
MAX_ROUNDS = 4


class FirestoreTransactions:
    """The transactions of the Firestore store on ``runs``, keeping ``writes`` (the store's
    remembered writes) true to what they commit."""

    def __init__(self, runs: FirestoreRuns, writes: RememberedWrites[datetime]) -> None:
        self.runs = runs
        self.writes = writes

    def complete(
        self,
        run_id: str,
        attempt_id: str,
        work: Work,
        now: Moment,
        *,
        keep_for: timedelta | None,
    ) -> TransactionOutcome:
        """:meth:`TransactionalStore.complete_in_transaction`."""
        runs, writes = self.runs, self.writes
        ref = runs.document(run_id)
        bound_transactions(runs.client, runs.call_timeout)
        tries = 0

        @firestore.transactional
        def attempt(transaction: firestore.Transaction) -> str | None:
            nonlocal tries
            snapshot = ref.get(transaction=transaction, **runs.call_options)
            stored = decode_run(run_id, snapshot.to_dict()) if snapshot.exists else None
            record = held(stored, run_id, attempt_id)
            tries += 1
            result_json = guarded_work(work, transaction)
            done = completion(record, result_json, resolve(now), keep_for)
            transaction.set(ref, encode_run(done))
            return result_json

        raised: Exception | None = None
        for _ in range(MAX_ROUNDS):
            try:
                result = attempt(runs.client.transaction())
            except api.Aborted:
                continue  # A read aborted on contention: nothing was committed, begin again.
            except NotHeld:
                writes.forget(run_id, attempt_id)
                return TransactionOutcome(held=False, result_json=None, tries=tries)
            except AlreadyCompleted as done:
                writes.forget(run_id, attempt_id)
                return TransactionOutcome(
                    held=True, result_json=done.record.result_json, tries=tries
                )
            except WorkRaised as carrier:
                raised = carrier.error
                break
            except (api.GoogleAPIError, ValueError, OSError) as exc:
                # ValueError: the client's attempts at the Commit all aborted, or the rollback
                # after a failed Commit found nothing to roll back. The Commit may have landed
                # before its call failed: the record tells.
                landed = self.read_back(run_id, attempt_id)
                if landed is not None:
                    return TransactionOutcome(
                        held=True, result_json=landed.result_json, tries=tries
                    )
                # A failed rollback after the failure reports itself, not the failure: name both.
                why = f"{exc} (after: {exc.__context__})" if exc.__context__ is not None else exc
                raise StoreUnavailable(
                    f"Firestore store: could not complete run {run_id} in a transaction: {why}"
                ) from exc
            else:
                writes.forget(run_id, attempt_id)  # Finished: no later write conditions on it.
                return TransactionOutcome(held=True, result_json=result, tries=tries)
        if raised is None:
            raise StoreUnavailable(f"run {run_id}: too much contention to complete it")
        # Raised outside the except clause: the handler's own exception, its chain untouched.
        raise raised

    def record_step(self, run_id: str, attempt_id: str, step_work: StepWork) -> TransactionOutcome:
        """:meth:`TransactionalStore.record_step_in_transaction`."""
        runs, writes = self.runs, self.writes
        ref = runs.document(run_id)
        bound_transactions(runs.client, runs.call_timeout)
        tries = 0
        written: list[StepRecord] = []

        @firestore.transactional
        def attempt(transaction: firestore.Transaction) -> tuple[StepRecord, RunRecord]:
            nonlocal tries
            snapshot = ref.get(transaction=transaction, **runs.call_options)
            record = decode_run(run_id, snapshot.to_dict()) if snapshot.exists else None
            if record is None or not decisions.holds(record, attempt_id):
                raise NotHeld(run_id)
            tries += 1
            step = guarded_work(step_work, transaction)
            written.append(step)
            recorded = with_step(record, step)
            transaction.set(ref, encode_run(recorded))  # The last write: its result is the run's.
            return step, recorded

        raised: Exception | None = None
        for _ in range(MAX_ROUNDS):
            transaction = runs.client.transaction()
            try:
                step, recorded = attempt(transaction)
            except api.Aborted:
                continue  # A read aborted on contention: nothing was committed, begin again.
            except NotHeld:
                writes.forget(run_id, attempt_id)
                return TransactionOutcome(held=False, result_json=None, tries=tries)
            except WorkRaised as carrier:
                raised = carrier.error
                break
            except (api.GoogleAPIError, ValueError, OSError) as exc:
                # As in complete(): the Commit may have landed, the record tells.
                writes.forget(run_id, attempt_id)  # Its next write reads the document first.
                landed = step_landed(runs, run_id, attempt_id, written)
                if landed is not None:
                    return TransactionOutcome(
                        held=True, result_json=landed.result_json, tries=tries
                    )
                why = f"{exc} (after: {exc.__context__})" if exc.__context__ is not None else exc
                raise StoreUnavailable(
                    f"Firestore store: could not record a step of run {run_id} in a "
                    f"transaction: {why}"
                ) from exc
            else:
                remember_commit(writes, transaction, recorded)
                return TransactionOutcome(held=True, result_json=step.result_json, tries=tries)
        if raised is None:
            raise StoreUnavailable(f"run {run_id}: too much contention to record a step")
        raise raised  # The step's own exception, outside the except clause: its chain untouched.

    def read_back(self, run_id: str, attempt_id: str) -> RunRecord | None:
        """The run's record if it shows ``attempt_id`` completed it; None if not, or
        unreadable."""
        try:
            record = self.runs.get(run_id)
        except StoreUnavailable:
            return None
        if completed_by(record, attempt_id) is None:
            return None
        self.writes.forget(run_id, attempt_id)
        return record


def remember_commit(
    writes: RememberedWrites[datetime], transaction: Any, record: RunRecord
) -> None:
    """Let the attempt's next write (a renewal) condition on the committed document without
    reading it: the update time of the transaction's last write, the run's document."""
    results = getattr(transaction, "write_results", None) or []
    update_time = getattr(results[-1], "update_time", None) if results else None
    if update_time is None:
        writes.forget(record.run_id, record.attempt_id)
    else:
        writes.remember(record, update_time)


def guarded_work(work: Callable[[Any], _T], transaction: Any) -> _T:
    """``work(transaction)``; its exceptions carried in :class:`WorkRaised`, but for
    contention (Firestore aborted the handler's read), which runs the transaction again."""
    try:
        return work(GoogleTransaction(transaction))  # It may not commit it.
    except api.Aborted:
        raise
    except Exception as exc:
        raise WorkRaised(exc) from exc


def bound_transactions(client: Any, timeout: float) -> None:
    """Give the BeginTransaction, Commit and Rollback RPCs of ``client`` a deadline of
    ``timeout`` seconds, their retries on UNAVAILABLE included, when a call sets none.

    A ``Transaction`` makes them with the client's defaults, 60 s each
    (``firestore_v1/services/firestore/transports/base.py``, google-cloud-firestore 2.x), so a
    frozen database would hold the handler's request a minute per RPC past the store's
    ``call_timeout``. The change is made once per client, to the client the store uses.
    """
    # The client names its generated API client only privately; that one's transport is public.
    transport = client._firestore_api.transport  # noqa: SLF001 - see the comment above.
    retry = retries.Retry(
        predicate=_TRANSIENT, initial=0.05, maximum=1.0, multiplier=2.0, timeout=timeout
    )
    bound_rpcs(transport, retry, timeout, _TRANSACTION_RPCS)
