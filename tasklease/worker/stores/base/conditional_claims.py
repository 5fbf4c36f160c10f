"""Claim, renew and finish a run by conditional writes on its one record, without a
transaction: the algorithm the Postgres and Firestore stores share.

A backend supplies three primitives on one record per run (:class:`ConditionalWrites`):
insert if absent, read versioned, and write if the stored version is still the one read (a
compare-and-set). Of two concurrent changes one wins; the other reads again and decides again
from what is there, with the rules of :mod:`tasklease.worker.core.decisions`.

- a claim inserts the record the rules give for an absent run; if the run exists, it decides
  from the stored record (read in the same round trip where the backend can) and takes it
  over by a conditional write.
- renew and finish (:meth:`ConditionalClaims.if_held`) write conditional on the version of
  this attempt's own last write, which :class:`RememberedWrites` keeps, without reading
  first; a version that moved (another process wrote) means a read, then the write.

A write whose outcome is unknown (its call failed after sending it) is recognised by the
stored attempt id: the record holds by this attempt, so the write landed. A claim that may
have landed but cannot be shown to have is noted as an orphan and given back soon
(:mod:`.orphans`), so the task's retry is not locked out for a whole lease.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from tasklease.errors import StoreUnavailable
from tasklease.worker.core import decisions
from tasklease.worker.core.records import Claim, ClaimRequest, RunRecord, RunStatus, Verdict
from tasklease.worker.stores.base.orphans import OrphanClaims, orphan_released
from tasklease.worker.stores.base.store import Moment, Update, resolve

__all__ = [
    "MAX_REMEMBERED_WRITES",
    "Calls",
    "ConditionalClaims",
    "ConditionalWrites",
    "Inserted",
    "MayHaveLanded",
    "RememberedWrites",
    "Versioned",
]

V = TypeVar("V")  # A stored record's version: a row's version number, a document's update time.
_T = TypeVar("_T")

MAX_REMEMBERED_WRITES = 10_000
"""Writes this process made and may still need to condition on, per (run id, attempt id)."""


@dataclass(frozen=True)
class Versioned(Generic[V]):
    """A stored record as read, with its version; ``read_at`` is the server's time of the
    read where the backend reports one (None: the call's own clock decides)."""

    record: RunRecord
    version: V
    read_at: datetime | None = None


@dataclass(frozen=True)
class Inserted(Generic[V]):
    """The record was inserted; ``version`` is the new record's."""

    version: V


class MayHaveLanded(StoreUnavailable):
    """A write failed in a way that may have committed it (its call failed after sending it,
    or the client's retry conflicted with its own first try): only a read can tell.

    ``ours_only``: the write landed only if the record read holds by this attempt (False: any
    record read is the answer, as after a conflict)."""

    def __init__(self, message: str, error: Exception, *, ours_only: bool = True) -> None:
        super().__init__(message)
        self.error = error
        self.ours_only = ours_only


class ConditionalWrites(ABC, Generic[V]):
    """A backend's three primitives on the one record of a run. Each raises the backend's
    own errors, or :class:`MayHaveLanded` for a write whose outcome is unknown."""

    @abstractmethod
    def insert_if_absent(self, record: RunRecord) -> Inserted[V] | Versioned[V] | None:
        """Insert ``record`` if its run has none. Otherwise the stored record, read in the
        same round trip where the backend can; None when neither (a first insert raced
        ours, the record vanished, contention): decide again."""

    @abstractmethod
    def read_versioned(self, run_id: str) -> Versioned[V] | None:
        """The stored record of ``run_id`` with its version, or None."""

    @abstractmethod
    def write_if_version(
        self, before: Versioned[V], record: RunRecord, *, finishing: bool = False
    ) -> V | None:
        """Write ``record`` if the stored record is still ``before`` (its version, its
        attempt); the new version, or None if it moved on. ``finishing``: a finish
        conditional on this process's own last write, which a backend may send together
        with other threads' (Postgres group commit)."""

    def deciding(self, read: Versioned[V]) -> AbstractContextManager[None]:
        """A block in which the call's clock reads ``read``'s time, for a backend whose
        reads report the server's; by default the clock is left alone."""
        return nullcontext()


class Calls(Protocol[V]):
    """Runs ``body`` on a backend's primitives as one bounded store call named ``action``;
    every failure of the backend is raised as :class:`StoreUnavailable`."""

    def __call__(self, action: str, body: Callable[[ConditionalWrites[V]], _T]) -> _T: ...


class RememberedWrites(Generic[V]):
    """The version of this process's last write per (run, attempt), most recent last,
    bounded: a renewal or finish conditions on it without reading, and a write whose
    outcome was unknown is recognised by it. A finished record is not kept (nothing more
    conditions on it)."""

    def __init__(self, limit: int = MAX_REMEMBERED_WRITES) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._writes: OrderedDict[tuple[str, str], Versioned[V]] = OrderedDict()

    def remember(self, record: RunRecord, version: V) -> None:
        key = (record.run_id, record.attempt_id)
        with self._lock:
            if record.status is not RunStatus.IN_PROGRESS:
                self._writes.pop(key, None)  # Finished: nothing more to condition on.
                return
            self._writes[key] = Versioned(record, version)
            self._writes.move_to_end(key)
            while len(self._writes) > self._limit:
                self._writes.popitem(last=False)

    def recall(self, run_id: str, attempt_id: str) -> Versioned[V] | None:
        with self._lock:
            return self._writes.get((run_id, attempt_id))

    def forget(self, run_id: str, attempt_id: str) -> None:
        with self._lock:
            self._writes.pop((run_id, attempt_id), None)

    def forget_all(self) -> None:
        """Forget every write (a forked child: the parent process owns them)."""
        # Not under the lock: see OrphanClaims.forget_all (a lock held at the fork stays held).
        self._lock = threading.Lock()
        self._writes = OrderedDict()

    def __len__(self) -> int:
        return len(self._writes)


class ConditionalClaims(Generic[V]):
    """The claim and the held-run write of a store built on :class:`ConditionalWrites`,
    with this process's remembered writes and its claims that may have landed unseen.

    ``name`` opens the store's error messages (``"Firestore store"``). ``max_rounds``: rounds
    of read and decide again before a call reports contention. ``any_failure_may_have_landed``:
    every failed claim call is noted as a possible orphan (a backend whose call may fail
    after any statement it sent, without telling which); otherwise only a
    :class:`MayHaveLanded` write that a read could not show landed is.
    """

    def __init__(
        self,
        calls: Calls[V],
        *,
        name: str,
        max_rounds: int,
        any_failure_may_have_landed: bool = False,
        logger: logging.Logger | None = None,
    ) -> None:
        self._calls = calls
        self._name = name
        self._max_rounds = max_rounds
        self._any_failure_may_have_landed = any_failure_may_have_landed
        self.writes: RememberedWrites[V] = RememberedWrites()
        self.orphans = (
            OrphanClaims(self.give_back) if logger is None else OrphanClaims(self.give_back, logger)
        )

    def forget_all(self) -> None:
        """Drop what this process remembered (a forked child: the parent process owns it)."""
        self.writes.forget_all()
        self.orphans.forget_all()

    def close(self) -> None:
        self.orphans.close()

    # --- Claims ---------------------------------------------------------------------

    def claim(self, request: ClaimRequest, now: Moment) -> Claim:
        """:meth:`LeaseStore.claim <tasklease.worker.stores.base.store.LeaseStore.claim>`."""
        # The retry of a delivery whose claim landed unseen: give that claim back first. (Other
        # runs' orphans are left to the background, so an outage does not slow every claim.)
        self.orphans.release(request.run_id)
        tried: list[RunRecord] = []
        try:
            return self._calls("claim a run", lambda rows: self._claim(rows, request, now, tried))
        except StoreUnavailable:
            if tried and self._any_failure_may_have_landed:
                self.orphans.note(tried[-1])  # Its write may have landed: give it back soon.
            raise

    def _claim(
        self,
        rows: ConditionalWrites[V],
        request: ClaimRequest,
        now: Moment,
        tried: list[RunRecord],
    ) -> Claim:
        for _ in range(self._max_rounds):
            fresh = decisions.claim(None, request, resolve(now))
            tried.append(fresh.record)
            try:
                found = rows.insert_if_absent(fresh.record)
            except MayHaveLanded as unsure:
                found = self._read_back(rows, fresh.record, unsure)
            if found is None:
                continue  # A first claim raced ours, or the record vanished: decide again.
            if isinstance(found, Inserted):
                self.writes.remember(fresh.record, found.version)
                return fresh
            record = found.record
            if decisions.holds(record, request.attempt_id):  # Ours, landed by a retry.
                self.writes.remember(record, found.version)
                return Claim(Verdict.CLAIMED, record)
            with rows.deciding(found):
                outcome = decisions.claim(record, request, resolve(now))
            if outcome.verdict is not Verdict.CLAIMED:
                return outcome
            tried.append(outcome.record)
            try:
                version = rows.write_if_version(found, outcome.record)
            except MayHaveLanded as unsure:
                landed = self._read_back(rows, outcome.record, unsure)
                assert landed is not None  # Read back only as ours.
                self.writes.remember(landed.record, landed.version)
                return Claim(Verdict.CLAIMED, landed.record, outcome.took_over_from)
            if version is not None:
                self.writes.remember(outcome.record, version)
                return outcome
        raise StoreUnavailable(f"run {request.run_id}: too much contention to claim it")

    def _read_back(
        self, rows: ConditionalWrites[V], claimed: RunRecord, unsure: MayHaveLanded
    ) -> Versioned[V] | None:
        """The record after a claim's write that may have landed: the stored record if it
        holds by this attempt (any record, or None, unless ``unsure.ours_only``). Otherwise
        the claim fails, noted as an orphan in case it landed unseen or lands late."""
        try:
            found = rows.read_versioned(claimed.run_id)
        except StoreUnavailable as unread:
            self.orphans.note(claimed)
            # The read's own error: its StoreUnavailable would name the store a second time.
            why = unread.__cause__ if unread.__cause__ is not None else unread
            raise StoreUnavailable(
                f"{self._name}: could not claim a run ({unsure.error}) nor read it back: {why}"
            ) from unsure.error
        if not unsure.ours_only or (
            found is not None and decisions.holds(found.record, claimed.attempt_id)
        ):
            return found
        self.orphans.note(claimed)
        raise StoreUnavailable(f"{self._name}: could not claim a run: {unsure.error}") from (
            unsure.error
        )

    # --- Writes by the holder ---------------------------------------------------------

    def if_held(
        self,
        run_id: str,
        attempt_id: str,
        update: Update,
        now: Moment,
        finished: RunStatus | None,
    ) -> RunRecord | None:
        """:meth:`LeaseStore._if_held <tasklease.worker.stores.base.store.LeaseStore>`: one
        conditional write when this process remembers the attempt's last write."""
        return self._calls(
            "change a run",
            lambda rows: self._if_held(
                rows, run_id, attempt_id, update=update, now=now, finished=finished
            ),
        )

    def _if_held(
        self,
        rows: ConditionalWrites[V],
        run_id: str,
        attempt_id: str,
        *,
        update: Update,
        now: Moment,
        finished: RunStatus | None,
    ) -> RunRecord | None:
        held = self.writes.recall(run_id, attempt_id)
        for _ in range(self._max_rounds):
            remembered = held is not None
            if held is None:
                held = rows.read_versioned(run_id)
                if held is None:
                    return None
                if decisions.finished_by(held.record, attempt_id, finished):
                    # An earlier try of this finish landed, though its call failed.
                    self.writes.forget(run_id, attempt_id)
                    return held.record
                if not decisions.holds(held.record, attempt_id):
                    self.writes.forget(run_id, attempt_id)
                    return None
            with rows.deciding(held):
                written = update(held.record, resolve(now))
            # A renewal is never sent with other threads' writes: it may wait on a
            # transactional handler's lock on the run.
            finishing = remembered and finished is not None
            version = rows.write_if_version(held, written, finishing=finishing)
            if version is not None:
                self.writes.remember(written, version)
                return written
            self.writes.forget(run_id, attempt_id)
            held = None  # Changed under us: read it and decide again.
        raise StoreUnavailable(f"run {run_id}: too much contention to change it")

    def give_back(self, run_id: str, attempt_id: str, claimed_at: datetime) -> RunRecord | None:
        """Release a claim that may have landed unseen, while ``attempt_id`` still holds
        it, as of the claim's own time, its attempt not counted (:mod:`.orphans`)."""
        return self.if_held(run_id, attempt_id, orphan_released, claimed_at, RunStatus.RELEASED)
