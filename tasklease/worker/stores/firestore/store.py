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
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from google.api_core import exceptions as api
from google.api_core import retry as retries
from google.cloud import firestore

from tasklease.errors import StoreUnavailable
from tasklease.worker.core import decisions, locking
from tasklease.worker.core.queries import Position, RunFilter
from tasklease.worker.core.records import (
    Claim,
    ClaimRequest,
    LockRecord,
    RunRecord,
    RunStatus,
    Verdict,
)
from tasklease.worker.stores.base.locks import LockStore
from tasklease.worker.stores.base.queries import OperatorQueries
from tasklease.worker.stores.base.store import Change, LockChange, Moment, Update, resolve
from tasklease.worker.stores.base.tally import TALLY_KEPT
from tasklease.worker.stores.firestore import locks, tally, transactions
from tasklease.worker.stores.firestore.codec import decode_run, encode_run
from tasklease.worker.stores.firestore.orphans import OrphanClaims, orphan_released

_T = TypeVar("_T")

DEFAULT_COLLECTION = "tasklease_runs"
# Rounds of read-and-retry after failed preconditions before reporting contention.
MAX_ROUNDS = 8
# Writes this process made and may still need to condition on, per (run id, attempt id).
MAX_REMEMBERED_WRITES = 10_000
# Errors the client retries by itself within one call (a retried write may then conflict with
# its own first try, which the code below recognises by the stored attempt id).
_TRANSIENT = retries.if_exception_type(
    api.ServiceUnavailable, api.DeadlineExceeded, api.InternalServerError, api.ResourceExhausted
)
# Errors after which a write may have landed: the server may have committed it before the
# call failed (RetryError: the client's retries ran out of time, the last one such an error).
_UNCERTAIN = (
    api.DeadlineExceeded,
    api.ServiceUnavailable,
    api.InternalServerError,
    api.Unknown,
    api.Cancelled,
    api.RetryError,
)
log = logging.getLogger("tasklease.store.firestore")


class FirestoreStore(
    transactions.FirestoreTransactions, LockStore, OperatorQueries, tally.FirestoreTally
):
    """Run records in ``collection`` (document id: the hashed run id, so writes spread out).

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
        self._retry = retries.Retry(
            predicate=_TRANSIENT, initial=0.1, maximum=2.0, multiplier=2.0, timeout=call_timeout
        )
        self._client = client
        self._client_pid = os.getpid() if client is not None else None
        self._project = project
        self._database = database
        self._lock = threading.Lock()
        # (run id, attempt id) -> (update_time of our last write, the record we wrote).
        self._writes: OrderedDict[tuple[str, str], tuple[datetime, RunRecord]] = OrderedDict()
        # Claims whose write may have landed though the claim failed: released on the next
        # claim of their run, or by a background retry.
        self._orphans = OrphanClaims(self._give_back_orphan)

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
                    with self._guard("connect"):
                        self._client = firestore.Client(
                            project=self._project, database=self._database
                        )
                    self._client_pid = os.getpid()
                    self._writes.clear()
                    self._orphans.forget_all()  # The parent process still owns them.
        return self._client

    def claim(self, request: ClaimRequest, now: Moment) -> Claim:
        # The retry of a delivery whose claim landed unseen: give that claim back first. (Other
        # runs' orphans are left to the background, so an outage does not slow every claim.)
        self._orphans.release(request.run_id)
        ref = self.run_document(request.run_id)
        with self._guard("claim a run"):
            for _ in range(MAX_ROUNDS):
                fresh = decisions.claim(None, request, resolve(now))
                try:
                    written = ref.create(encode_run(fresh.record), **self.call_options)
                except api.Aborted:
                    continue  # Contention: a Conflict subclass, but nothing was written.
                except api.Conflict as exc:  # AlreadyExists, or a conflict with our own
                    # first try, retried by the client: unreadable, it may be our landed claim.
                    snapshot = self._read_back(ref, fresh.record, exc, ours_only=False)
                except _UNCERTAIN as exc:
                    snapshot = self._read_back(ref, fresh.record, exc)
                else:
                    self.remember_write(fresh.record, written.update_time)
                    return fresh
                if not snapshot.exists:
                    continue  # Deleted in between (TTL or purge): create again.
                record = decode_run(request.run_id, snapshot.to_dict())
                if decisions.holds(record, request.attempt_id):
                    # Our create landed: the client retried it, or its call failed afterwards.
                    self.remember_write(record, snapshot.update_time)
                    return Claim(Verdict.CLAIMED, record)
                outcome = decisions.claim(record, request, resolve(now))
                if outcome.verdict is not Verdict.CLAIMED:
                    return outcome
                try:
                    updated = self._update_if_unchanged(ref, outcome.record, snapshot.update_time)
                except _UNCERTAIN as exc:
                    snapshot = self._read_back(ref, outcome.record, exc)
                    landed = decode_run(request.run_id, snapshot.to_dict())
                    self.remember_write(landed, snapshot.update_time)
                    return Claim(Verdict.CLAIMED, landed, outcome.took_over_from)
                if updated is not None:
                    self.remember_write(outcome.record, updated)
                    return outcome
        raise StoreUnavailable(f"run {request.run_id}: too much contention to claim it")

    def _read_back(
        self, ref: Any, claimed: RunRecord, error: Exception, *, ours_only: bool = True
    ) -> Any:
        """The document after a claim's write failed in a way that may have landed it: its
        snapshot if it shows this attempt's claim (any snapshot unless ``ours_only``).
        Otherwise the claim fails (StoreUnavailable), noted as an orphan to release in case
        it landed unseen or lands late."""
        try:
            snapshot = ref.get(**self.call_options)
        except (api.GoogleAPIError, ValueError, OSError) as unread:
            self._orphans.note(claimed)
            raise StoreUnavailable(
                f"Firestore store: could not claim a run ({error}) nor read it back: {unread}"
            ) from error
        if not ours_only or (
            snapshot.exists
            and decisions.holds(decode_run(claimed.run_id, snapshot.to_dict()), claimed.attempt_id)
        ):
            return snapshot
        self._orphans.note(claimed)
        raise StoreUnavailable(f"Firestore store: could not claim a run: {error}") from error

    def _give_back_orphan(
        self, run_id: str, attempt_id: str, claimed_at: datetime
    ) -> RunRecord | None:
        return self._if_held(run_id, attempt_id, orphan_released, claimed_at, RunStatus.RELEASED)

    def _if_held(
        self,
        run_id: str,
        attempt_id: str,
        update: Update,
        now: Moment,
        finished: RunStatus | None,
    ) -> RunRecord | None:
        ref = self.run_document(run_id)
        with self._lock:
            remembered = self._writes.get((run_id, attempt_id))
        with self._guard("change a run"):
            for _ in range(MAX_ROUNDS):
                if remembered is None:
                    snapshot = ref.get(**self.call_options)
                    if not snapshot.exists:
                        return None
                    record = decode_run(run_id, snapshot.to_dict())
                    if decisions.finished_by(record, attempt_id, finished):
                        # An earlier try of this finish landed, though its call failed.
                        self.forget_write(run_id, attempt_id)
                        return record
                    if not decisions.holds(record, attempt_id):
                        self.forget_write(run_id, attempt_id)
                        return None
                    remembered = (snapshot.update_time, record)
                update_time, record = remembered
                expected = update(record, resolve(now))
                written = self._update_if_unchanged(ref, expected, update_time)
                if written is not None:
                    self.remember_write(expected, written)
                    return expected
                remembered = None  # Changed under us: read it and decide again.
        raise StoreUnavailable(f"run {run_id}: too much contention to change it")

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

        with self._guard("change a run"):
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
        with self._guard("change a lock"):
            value: _T = self._compare_and_set(
                self._lock_document(name),
                lambda data: locks.decode(name, data),
                locks.encode,
                # The holder's run is read apart from the lock's precondition: enough, as the
                # lock rules only ask whether the holding attempt ended its run (see base).
                lambda lock: change(lock, self.get),
                # Conflict covers Aborted and AlreadyExists; an uncertain write is read back.
                retry_on=(api.Conflict, api.FailedPrecondition, api.NotFound, *_UNCERTAIN),
                what=f"lock {name}",
            )
            return value

    def get_lock(self, name: str) -> LockRecord | None:
        with self._guard("read a lock"):
            snapshot = self._lock_document(name).get(**self.call_options)
        return locks.decode(name, snapshot.to_dict()) if snapshot.exists else None

    def list_locks(self, limit: int = 100) -> list[LockRecord]:
        collection = self.client.collection(self.lock_collection)
        with self._guard("list locks"):
            return locks.listed(collection, limit, self.call_timeout)

    def _lock_document(self, name: str) -> Any:
        return self.client.collection(self.lock_collection).document(locking.lock_id(name))

    def get(self, run_id: str) -> RunRecord | None:
        with self._guard("read a run"):
            snapshot = self.run_document(run_id).get(**self.call_options)
        return decode_run(run_id, snapshot.to_dict()) if snapshot.exists else None

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        query: Any = self.client.collection(self.collection)
        if status is not None:
            query = query.where(filter=firestore.FieldFilter("status", "==", status.value))
        query = query.order_by("claimed_at", direction=firestore.Query.DESCENDING).limit(limit)
        with self._guard("list runs"):
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
        with self._guard("list runs"):
            return [
                decode_run(snapshot.id, snapshot.to_dict())
                for snapshot in query.limit(limit).stream(timeout=self.call_timeout)
            ]

    def _find_by_identity(self, name: str, value: str) -> list[RunRecord]:
        # Firestore indexes every field of a map by itself: no composite index needed.
        query = self.client.collection(self.collection).where(
            filter=firestore.FieldFilter(f"identity.{name}", "==", value)
        )
        with self._guard("look runs up"):
            return [
                decode_run(snapshot.id, snapshot.to_dict())
                for snapshot in query.stream(timeout=self.call_timeout)
            ]

    def _operator_change(self, run_id: str, change: Change[_T]) -> _T:
        """Read, decide, then write on the condition that the document is still the version
        read (``last_update_time``), else read and decide again: a holder's renew or finish
        racing an operator's release is then refused one way or the other."""
        with self._guard("change a run"):
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
        with self._guard("purge expired runs"):
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
        return purged + self.purge_delivery_counts(now - TALLY_KEPT)

    def close(self) -> None:
        self._orphans.close()
        if self._client is not None and self._client_pid == os.getpid():
            self._client.close()  # type: ignore[no-untyped-call]

    @property
    def call_options(self) -> dict[str, Any]:
        return {"retry": self._retry, "timeout": self.call_timeout}

    def run_document(self, run_id: str) -> Any:
        return self.client.collection(self.collection).document(run_id)

    def _update_if_unchanged(
        self, ref: Any, record: RunRecord, update_time: datetime
    ) -> datetime | None:
        """Write ``record`` if the document is still at ``update_time``; None if it moved on."""
        option = self.client.write_option(last_update_time=update_time)
        try:
            written = ref.update(encode_run(record), option=option, **self.call_options)
        except (api.FailedPrecondition, api.NotFound, api.Aborted):
            return None
        result: datetime = written.update_time
        return result

    def remember_write(self, record: RunRecord, update_time: datetime) -> None:
        key = (record.run_id, record.attempt_id)
        with self._lock:
            if record.status is RunStatus.IN_PROGRESS:
                self._writes[key] = (update_time, record)
                self._writes.move_to_end(key)
                while len(self._writes) > MAX_REMEMBERED_WRITES:
                    self._writes.popitem(last=False)
            else:
                self._writes.pop(key, None)  # Finished: nothing more to condition on.

    def forget_write(self, run_id: str, attempt_id: str) -> None:
        with self._lock:
            self._writes.pop((run_id, attempt_id), None)

    @contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        """Turn Firestore and transport errors into :class:`StoreUnavailable`."""
        try:
            yield
        except StoreUnavailable:
            raise
        except (api.GoogleAPIError, ValueError, OSError) as exc:
            # ValueError: @transactional gives up after its retries on ABORTED.
            raise StoreUnavailable(f"Firestore store: could not {action}: {exc}") from exc
