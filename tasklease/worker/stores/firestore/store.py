"""The production store: one Firestore document per run, in as few round trips as possible.

Google's sample runs two transactions per execution: 6 RPCs for a first execution, 3 for a
duplicate (docs/platform-facts.md). This store relies on single-document preconditions, which
Firestore evaluates atomically:

- claim: ``create()`` (precondition: the document does not exist). 1 RPC.
- a duplicate: the create fails, one ``get()`` shows the record. 2 RPCs.
- taking over an expired lease: the same ``get()``, then an ``update()`` whose precondition is
  that document's ``update_time``: a compare-and-set, so of two concurrent takeovers exactly
  one wins. 3 RPCs; no transaction (it would add BeginTransaction and a lock).
- renew and finish: an ``update()`` conditional on the ``update_time`` of this attempt's own
  last write, which the store remembers. 1 RPC.

A failed precondition means the document changed under us: the store reads it again and
decides from what is there. That also covers the client's own automatic retries (a commit
retried after an UNAVAILABLE can fail against the write its first try made) and a write that
landed although its call failed: the stored attempt id tells our write from another
attempt's. A claim whose write may have landed but cannot be read back is answered
:class:`StoreUnavailable` and released later (conditionally, only while that attempt still
holds it), so the task's retry is not locked out for a whole lease.

The claim and the holder's writes are the shared conditional-write algorithm
(:mod:`~tasklease.worker.stores.base.conditional_claims`) over the documents' primitives
(:mod:`.documents`); transactions and the tally are collaborators the store holds.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar

from google.api_core import exceptions as api
from google.cloud import firestore

from tasklease.errors import StoreUnavailable
from tasklease.joins import Member
from tasklease.worker.core import locking
from tasklease.worker.core.fan_in import ChildEntry, FanInRecord, Progress
from tasklease.worker.core.queries import Position, RunFilter
from tasklease.worker.core.records import Claim, ClaimRequest, LockRecord, RunRecord, RunStatus
from tasklease.worker.stores.base.conditional_claims import (
    MAX_REMEMBERED_WRITES,
    ConditionalClaims,
    ConditionalWrites,
)
from tasklease.worker.stores.base.fan_ins import FanInStore
from tasklease.worker.stores.base.locks import LockStore
from tasklease.worker.stores.base.queries import OperatorQueries
from tasklease.worker.stores.base.store import Change, LockChange, Moment, Update
from tasklease.worker.stores.base.tally import TALLY_KEPT, DeliveryTally, MinuteCounts, TallyKey
from tasklease.worker.stores.base.transactional import (
    StepWork,
    TransactionalStore,
    TransactionOutcome,
    Work,
)
from tasklease.worker.stores.firestore import locks
from tasklease.worker.stores.firestore.codec import decode_run, encode_run
from tasklease.worker.stores.firestore.documents import UNCERTAIN, FirestoreRuns, guard
from tasklease.worker.stores.firestore.fan_ins import FirestoreFanIns
from tasklease.worker.stores.firestore.tally import FirestoreTally
from tasklease.worker.stores.firestore.transactions import FirestoreTransactions

__all__ = ["DEFAULT_COLLECTION", "MAX_REMEMBERED_WRITES", "MAX_ROUNDS", "FirestoreStore"]

_T = TypeVar("_T")

DEFAULT_COLLECTION = "tasklease_runs"
# Rounds of read-and-retry after failed preconditions before reporting contention.
MAX_ROUNDS = 8
log = logging.getLogger("tasklease.store.firestore")


class FirestoreStore(TransactionalStore, LockStore, FanInStore, OperatorQueries, DeliveryTally):
    """Run records in ``collection`` (document id: the hashed run id, so writes spread out);
    locks, joins (sharded, :mod:`.fan_ins`) and delivery counts in collections named after it.

    ``expire_at`` is a Firestore timestamp for a TTL policy on the collection (the deploy
    kit creates it); Firestore deletes expired documents within about a day, and until then
    the store treats them as absent. Give it a client, or use :meth:`from_options`, which
    creates one lazily per process (gRPC channels must not cross a fork).
    """

    transaction_reruns: ClassVar[bool] = True  # Firestore runs an aborted transaction again.
    max_record_bytes: ClassVar[int | None] = 1_048_576  # A document's size limit.

    def __init__(
        self,
        client: firestore.Client | None = None,
        collection: str = DEFAULT_COLLECTION,
        *,
        project: str | None = None,
        database: str | None = None,
        call_timeout: float = 10.0,
    ) -> None:
        """``call_timeout`` bounds each store call, the client's own retries included, so a
        Firestore outage answers 503 in seconds rather than blocking the request."""
        self.collection = collection
        self.call_timeout = call_timeout
        self._client = client
        self._client_pid = os.getpid() if client is not None else None
        self._project = project
        self._database = database
        self._lock = threading.Lock()
        self.runs = FirestoreRuns(lambda: self.client, collection, call_timeout)
        # The claim and the holder's writes by compare-and-set, this process's remembered
        # writes, and its claims that may have landed unseen (released on the next claim of
        # their run, or by a background retry).
        self.claims = ConditionalClaims(
            self._on_documents, name="Firestore store", max_rounds=MAX_ROUNDS, logger=log
        )
        self.transactions = FirestoreTransactions(self.runs, self.claims.writes)
        self.tally = FirestoreTally(self.runs)
        self.fan_ins = FirestoreFanIns(self.runs, self.claims.writes)

    @classmethod
    def from_options(
        cls,
        collection: str = DEFAULT_COLLECTION,
        database: str = "(default)",
        project: str | None = None,
        call_timeout: float | None = None,
    ) -> FirestoreStore:
        """The store ``firestore://?collection=...&database=...`` describes (project from
        ``GOOGLE_CLOUD_PROJECT`` unless given)."""
        return cls(
            None,
            collection,
            project=project or os.environ.get("GOOGLE_CLOUD_PROJECT"),
            database=database,
            **({"call_timeout": call_timeout} if call_timeout is not None else {}),
        )

    def __repr__(self) -> str:
        return f"FirestoreStore(collection={self.collection!r}, database={self._database!r})"

    @property
    def client(self) -> firestore.Client:
        if self._client is None or self._client_pid != os.getpid():
            with self._lock:
                if self._client is None or self._client_pid != os.getpid():
                    with guard("connect"):
                        self._client = firestore.Client(
                            project=self._project, database=self._database
                        )
                    self._client_pid = os.getpid()
                    self.claims.forget_all()  # The parent process still owns them.
        return self._client

    @property
    def database(self) -> str | None:
        """The Firestore database named when the store was made (``"(default)"`` from
        :meth:`from_options`), for a tool that opens a client of its own on it; None when none
        was named: the database of the client given, else the project's default."""
        return self._database

    def _on_documents(self, action: str, body: Callable[[ConditionalWrites[datetime]], _T]) -> _T:
        with guard(action):
            return body(self.runs)

    def claim(self, request: ClaimRequest, now: Moment) -> Claim:
        return self.claims.claim(request, now)

    def _if_held(
        self,
        run_id: str,
        attempt_id: str,
        update: Update,
        now: Moment,
        finished: RunStatus | None,
    ) -> RunRecord | None:
        return self.claims.if_held(run_id, attempt_id, update, now, finished)

    def _read_modify_write(self, run_id: str, change: Change[_T]) -> _T:
        """The generic path, in a transaction; the fast paths above do not need it."""
        ref = self.run_document(run_id)

        @firestore.transactional
        def apply(transaction: firestore.Transaction) -> _T:
            snapshot = ref.get(transaction=transaction)
            current = decode_run(run_id, snapshot.to_dict()) if snapshot.exists else None
            new_record, value = change(current)
            if new_record is not None:
                transaction.set(ref, encode_run(new_record))
            return value

        with guard("change a run"):
            result: _T = apply(self.client.transaction())
            return result

    @property
    def lock_collection(self) -> str:
        """Locks (exclusive jobs, concurrency keys) live beside the runs: ``<collection>_locks``."""
        return f"{self.collection}_locks"

    def _read_modify_write_lock(self, name: str, change: LockChange[_T]) -> _T:
        """One lock document changed by compare-and-set, no transaction: read it, then
        ``create()`` it (precondition: absent) or ``update()`` it (precondition: the update
        time read). A failed precondition means another writer came first: read again and
        decide again. A write that may have landed unseen is read again too; the lock rules
        recognise this attempt's own landed write by its attempt id (2 RPCs per change)."""
        with guard("change a lock"):
            value: _T = self._compare_and_set(
                self._lock_document(name),
                lambda data: locks.decode(name, data),
                locks.encode,
                # The holder's run is read apart from the lock's precondition: enough, as the
                # lock rules only ask whether the holding attempt ended its run, or whether
                # the requester's claim passed on: neither becomes false again (see base).
                lambda lock: change(lock, self.get),
                # Conflict covers Aborted and AlreadyExists; an uncertain write is read back.
                retry_on=(api.Conflict, api.FailedPrecondition, api.NotFound, *UNCERTAIN),
                what=f"lock {name}",
            )
            return value

    def get_lock(self, name: str) -> LockRecord | None:
        with guard("read a lock"):
            snapshot = self._lock_document(name).get(**self.call_options)
        return locks.decode(name, snapshot.to_dict()) if snapshot.exists else None

    def list_locks(self, limit: int = 100) -> list[LockRecord]:
        collection = self.client.collection(self.lock_collection)
        with guard("list locks"):
            return locks.listed(collection, limit, self.call_timeout)

    def _lock_document(self, name: str) -> Any:
        return self.client.collection(self.lock_collection).document(locking.lock_id(name))

    def get(self, run_id: str) -> RunRecord | None:
        return self.runs.get(run_id)

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        query: Any = self.client.collection(self.collection)
        if status is not None:
            query = query.where(filter=firestore.FieldFilter("status", "==", status.value))
        query = query.order_by("claimed_at", direction=firestore.Query.DESCENDING).limit(limit)
        with guard("list runs"):
            return [decode_run(snapshot.id, snapshot.to_dict()) for snapshot in query.stream()]

    # --- Operations: listing, lookup and operator changes ------------------------

    def _scan_runs(self, filters: RunFilter, after: Position | None, limit: int) -> list[RunRecord]:
        """One equality filter at most (status, else handler), with the claimed_at range and
        order: the composite indexes tasklease/deploy/deploy.py creates (status or handler, then
        claimed_at descending) serve it. The other filters are applied by the caller."""
        query: Any = self.client.collection(self.collection)
        status = filters.status_to_scan
        if status is not None:
            query = query.where(filter=firestore.FieldFilter("status", "==", status.value))
        elif filters.handler is not None:
            query = query.where(filter=firestore.FieldFilter("handler", "==", filters.handler))
        if filters.older_than is not None:
            query = query.where(filter=firestore.FieldFilter("claimed_at", "<", filters.older_than))
        if filters.newer_than is not None:
            query = query.where(
                filter=firestore.FieldFilter("claimed_at", ">=", filters.newer_than)
            )
        query = query.order_by("claimed_at", direction=firestore.Query.DESCENDING).order_by(
            "__name__", direction=firestore.Query.DESCENDING
        )
        if after is not None:
            query = query.start_after([after[0], after[1]])
        with guard("list runs"):
            return [
                decode_run(snapshot.id, snapshot.to_dict())
                for snapshot in query.limit(limit).stream(timeout=self.call_timeout)
            ]

    def _find_by_identity(self, name: str, value: str) -> list[RunRecord]:
        # Firestore indexes every field of a map by itself: no composite index needed.
        query = self.client.collection(self.collection).where(
            filter=firestore.FieldFilter(f"identity.{name}", "==", value)
        )
        with guard("look runs up"):
            return [
                decode_run(snapshot.id, snapshot.to_dict())
                for snapshot in query.stream(timeout=self.call_timeout)
            ]

    def _operator_change(self, run_id: str, change: Change[_T]) -> _T:
        """Read, decide, then write on the condition that the document is still the version
        read (``last_update_time``), else read and decide again: a holder's renew or finish
        racing an operator's release is then refused one way or the other."""
        with guard("change a run"):
            value: _T = self._compare_and_set(
                self.run_document(run_id),
                lambda data: decode_run(run_id, data),
                encode_run,
                change,
                # Changed under us (Aborted is a Conflict too): decide again.
                retry_on=(api.FailedPrecondition, api.NotFound, api.Conflict),
                what=f"run {run_id}",
            )
            return value

    def _compare_and_set(
        self,
        ref: Any,
        decode: Callable[[dict[str, Any] | None], Any],
        encode: Callable[[Any], dict[str, Any]],
        change: Callable[[Any], tuple[Any, _T]],
        *,
        retry_on: tuple[type[Exception], ...],
        what: str,
    ) -> _T:
        """Read one document, decide, then ``create()`` it (precondition: absent) or
        ``update()`` it (precondition: the update time read); on ``retry_on``, read and decide
        again. No transaction: single-document preconditions are atomic."""
        for _ in range(MAX_ROUNDS):
            snapshot = ref.get(**self.call_options)
            new, value = change(decode(snapshot.to_dict()) if snapshot.exists else None)
            decided: _T = value
            if new is None:
                return decided
            try:
                if snapshot.exists:
                    option = self.client.write_option(last_update_time=snapshot.update_time)
                    ref.update(encode(new), option=option, **self.call_options)
                else:
                    ref.create(encode(new), **self.call_options)
            except retry_on:
                continue
            return decided
        raise StoreUnavailable(f"{what}: too much contention to change it")

    def purge_expired(self, now: datetime) -> int:
        """Delete expired runs now (in production the TTL policy does this by itself)."""
        query = self.client.collection(self.collection).where(
            filter=firestore.FieldFilter("expire_at", "<=", now)
        )
        purged = 0
        with guard("purge expired runs"):
            for snapshot in query.stream():
                # Only the version read: a takeover since then makes it a live run again.
                option = self.client.write_option(last_update_time=snapshot.update_time)
                try:
                    snapshot.reference.delete(option=option, **self.call_options)
                except (api.FailedPrecondition, api.NotFound):
                    continue
                purged += 1
            lock_collection = self.client.collection(self.lock_collection)
            purged += locks.purge(self.client, lock_collection, now, self.call_options)
        purged += self.fan_ins.purge(now)
        return purged + self.purge_delivery_counts(now - TALLY_KEPT)

    def close(self) -> None:
        self.claims.close()
        if self._client is not None and self._client_pid == os.getpid():
            self._client.close()  # type: ignore[no-untyped-call]

    @property
    def call_options(self) -> dict[str, Any]:
        return self.runs.call_options

    def run_document(self, run_id: str) -> Any:
        return self.runs.document(run_id)

    # --- Capabilities held as collaborators -----------------------------------------

    def complete_in_transaction(
        self,
        run_id: str,
        attempt_id: str,
        work: Work,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> TransactionOutcome:
        """``work`` gets the ``Transaction`` (see :mod:`.transactions`)."""
        return self.transactions.complete(run_id, attempt_id, work, now, keep_for=keep_for)

    def record_step_in_transaction(
        self, run_id: str, attempt_id: str, step_work: StepWork, now: Moment
    ) -> TransactionOutcome:
        """The step's function gets the ``Transaction`` a transactional handler would."""
        return self.transactions.record_step(run_id, attempt_id, step_work)

    def _read_modify_write_member(
        self, run_id: str, member: Member, change: Change[_T], now: Moment, keep_for: timedelta
    ) -> tuple[_T, Progress]:
        """One read and one atomic Commit conditional on what it read: the run's change, and
        the child counted in its shard (and the join's root only when the child creates or
        fills the shard; see :mod:`.fan_ins`)."""
        return self.fan_ins.count(run_id, member, change, now, keep_for)

    def get_fan_in(self, join_id: str) -> FanInRecord | None:
        return self.fan_ins.get(join_id)

    def fan_in_progress(self, join_id: str) -> Progress | None:
        return self.fan_ins.progress(join_id)

    def fan_in_entries(
        self, join_id: str, after: str | None = None, limit: int = 1000
    ) -> list[ChildEntry]:
        return self.fan_ins.entries(join_id, after, limit)

    def fan_ins_of(self, parent_run_id: str, limit: int = 100) -> list[FanInRecord]:
        return self.fan_ins.of_parent(parent_run_id, limit)

    def mark_then_enqueued(self, join_id: str, now: datetime) -> None:
        self.fan_ins.mark_then_enqueued(join_id, now)

    def write_delivery_counts(self, instance: str, counts: MinuteCounts) -> None:
        self.tally.write(instance, counts)

    def delivery_counts(self, since: datetime) -> dict[datetime, Counter[TallyKey]]:
        return self.tally.read(since)

    def purge_delivery_counts(self, before: datetime) -> int:
        return self.tally.purge(before)
