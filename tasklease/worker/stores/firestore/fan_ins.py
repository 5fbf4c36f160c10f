"""The Firestore store's joins, sharded: a document takes about one sustained write a second
(docs/platform-facts.md), so no document is written once per child.

A join is a root document, ``<collection>_fan_ins/{join_id}``, with two subcollections:
``<collection>_fan_in_shards/{shard}`` (the counts of the children hashed to that shard) and
``<collection>_fan_in_entries/{sha256 of the key}`` (one per counted child). A child's finish
is one atomic commit: the run's new record, and, when it is final and its entry absent, the
entry created and counted in its shard. Only the child that creates its shard (the root is
created with the first shard, so a join shows from its first counted child) or fills it
(``shard_expected`` reached) writes the root too: at most ``2 * shards`` writes to the root
of a join however many children it has, and at most ``CHILDREN_PER_SHARD`` to a shard.

The commit is optimistic, not a transaction: one read of the run, the entry, the shard and
the root (no locks), then a Commit whose every write carries a precondition on the version
read (``update_time``, or absent for a ``create()``). A Commit is atomic and "fails the
entire write if any precondition is not met" (the client's WriteBatch.commit reference), so
the child's record and its count land together or not at all; a failed precondition means
another child (or the same child's duplicate) came first: read again and decide again. The
store's run writes work the same way (:mod:`.store`). A pessimistic transaction would lock
the shard on its read, and children of one shard all read it: Google's Firestore emulator
then lets none of them commit until its lock timeout ("Transaction lock timeout",
firebase/firebase-tools#6758; measured here: 10 threads in ``@transactional`` incrementing
one document, 3 committed in 105 s, where 80 optimistic writers all committed in 3 s).

The root's ``shards_done`` counts full shards: the join is closed when it reaches ``shards``.
The last child of a join fills its shard, so the commit that counts it sees the join close;
a child that did not fill its shard knows the join is open; a child found counted already (a
duplicate, a recount) has the root from the same read, and writes nothing.

Subcollections keep every query to one collection and one field (the key, the parent, the
expiry), which Firestore's automatic single-field indexes serve: no composite index. Every
document carries ``expire_at`` for a TTL policy on its collection group (the deploy kit
creates them); an entry is kept as long as its count keeps the join.
"""

from __future__ import annotations

import hashlib
import random
import time
from datetime import datetime, timedelta
from typing import Any, TypeVar

from google.api_core import exceptions as api
from google.cloud import firestore

from tasklease.errors import StoreUnavailable
from tasklease.joins import Member
from tasklease.worker.core import fan_in as rules
from tasklease.worker.core.fan_in import ChildEntry, FanInRecord, Progress, ShardRecord
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.stores.base.conditional_claims import RememberedWrites
from tasklease.worker.stores.base.store import Change, Moment, resolve
from tasklease.worker.stores.firestore.codec import decode_run, encode_run
from tasklease.worker.stores.firestore.documents import UNCERTAIN, FirestoreRuns, guard
from tasklease.worker.stores.firestore.locks import utc

__all__ = ["FirestoreFanIns", "entry_collection", "root_collection", "shard_collection"]

_T = TypeVar("_T")

# Rounds of read-and-retry of a conditional write before reporting contention.
MAX_ROUNDS = 8
# First pause before a child's commit, refused on a precondition, is decided again, doubled up
# to the maximum, with jitter; for at most the call timeout. A shard's children contend.
FIRST_PAUSE = 0.01
MAX_PAUSE = 0.5
# A commit refused on a precondition (AlreadyExists and Aborted are Conflicts): nothing landed.
_REFUSED = (api.FailedPrecondition, api.Conflict, api.NotFound)
# Firestore takes up to 500 writes in one Commit.
_BATCH = 500


def root_collection(runs: str) -> str:
    return f"{runs}_fan_ins"


def shard_collection(runs: str) -> str:
    return f"{runs}_fan_in_shards"


def entry_collection(runs: str) -> str:
    return f"{runs}_fan_in_entries"


class FirestoreFanIns:
    """The joins beside the runs of ``runs``, through its client and call options; ``writes``
    (the store's remembered writes) forgets what a child's finish supersedes."""

    def __init__(self, runs: FirestoreRuns, writes: RememberedWrites[datetime]) -> None:
        self.runs = runs
        self.writes = writes

    # --- A child's finish, counted --------------------------------------------------

    def count(
        self, run_id: str, member: Member, change: Change[_T], now: Moment, keep_for: timedelta
    ) -> tuple[_T, Progress]:
        """:meth:`FanInStore._read_modify_write_member` (see the module)."""
        deadline = time.monotonic() + self.runs.call_timeout
        pause = FIRST_PAUSE
        decided: list[RunRecord] = []
        refusals: list[Exception] = []
        try:
            with guard("finish a run and count it in its join"):
                while True:
                    done = self._count_once(
                        run_id,
                        member,
                        change,
                        now=now,
                        keep_for=keep_for,
                        decided=decided,
                        refusals=refusals,
                    )
                    if done is not None:
                        return done
                    if time.monotonic() + pause > deadline:
                        raise StoreUnavailable(
                            f"Firestore store: could not count run {run_id} in its join in "
                            f"time ({len(refusals)} commits refused or unanswered, the last: "
                            f"{refusals[-1]})"
                        ) from refusals[-1]
                    time.sleep(random.uniform(pause / 2, pause))
                    pause = min(pause * 2, MAX_PAUSE)
        finally:
            # A finished record is not written conditionally again, nor one that may have
            # landed unseen: forget the version this attempt's last write left.
            for record in decided[-1:]:
                self.writes.forget(record.run_id, record.attempt_id)

    def _count_once(
        self,
        run_id: str,
        member: Member,
        change: Change[_T],
        *,
        now: Moment,
        keep_for: timedelta,
        decided: list[RunRecord],
        refusals: list[Exception],
    ) -> tuple[_T, Progress] | None:
        """One read and one commit; None if the commit was refused, or may have landed
        (noted in ``refusals``): the caller reads and decides again, and a landed commit then
        shows as finished and counted."""
        runs = self.runs
        client = runs.client
        refs = [
            runs.document(run_id),
            self.entries_of(member.join_id).document(entry_id(member.key)),
            self.shards_of(member.join_id).document(str(member.shard)),
            self.root(member.join_id),
        ]
        found = {s.reference.path: s for s in client.get_all(refs, **runs.call_options)}
        run, entry_read, shard_read, root_read = (found[ref.path] for ref in refs)
        stored = decode_run(run_id, run.to_dict()) if run.exists else None
        new_record, value = change(stored)
        at = resolve(now)
        entry = rules.entry_of(new_record if new_record is not None else stored, member)
        writes: list[tuple[Any, dict[str, Any]]] = []
        if new_record is not None:
            decided.append(new_record)
            writes.append((run, encode_run(new_record)))
        if entry is None or entry_read.exists:
            progress = _progress_of(member.join_id, root_read)
        else:
            writes.append((entry_read, _entry_fields(entry, rules.kept_until(at, keep_for))))
            progress = self._counted(
                member,
                entry,
                at=at,
                keep_for=keep_for,
                shard_read=shard_read,
                root_read=root_read,
                writes=writes,
            )
        if not writes:
            return value, progress
        batch = client.batch()
        for snapshot, fields in writes:
            if snapshot.exists:  # Only at the version read.
                option = client.write_option(last_update_time=snapshot.update_time)
                batch.update(snapshot.reference, fields, option=option)
            else:
                batch.create(snapshot.reference, fields)
        try:
            batch.commit(**runs.call_options)
        except (*_REFUSED, *UNCERTAIN) as exc:
            refusals.append(exc)
            return None
        return value, progress

    @staticmethod
    def _counted(
        member: Member,
        entry: ChildEntry,
        *,
        at: datetime,
        keep_for: timedelta,
        shard_read: Any,
        root_read: Any,
        writes: list[tuple[Any, dict[str, Any]]],
    ) -> Progress:
        """Add to ``writes`` the shard with ``entry`` counted, and the root when this child
        creates the shard (the root then created, or kept longer: a purge reading the join
        before will not delete it) or fills it; return the join's progress."""
        stored = shard_read.to_dict() if shard_read.exists else None
        before = _shard(member.join_id, stored) if stored is not None else None
        shard = rules.shard_counted(before or rules.new_shard(member), entry)
        kept = rules.kept_until(at, keep_for)
        writes.append(
            (shard_read, _shard_fields(shard, max(_expiry(stored), kept) if stored else kept))
        )
        fills = shard.full and not (before is not None and before.full)
        if before is not None and not fills:
            return Progress(member.join_id, closed=False, then_enqueued=False)
        base = _root(member.join_id, root_read.to_dict()) if root_read.exists else None
        base = base or rules.opened(member, at, keep_for)
        root = base.replace(
            shards_done=base.shards_done + fills, expire_at=max(base.expire_at, kept)
        )
        writes.append((root_read, _root_fields(root)))
        return _progress(root)

    # --- Reads ----------------------------------------------------------------------

    def get(self, join_id: str) -> FanInRecord | None:
        """:meth:`FanInStore.get_fan_in`: the root, its counts summed over its shards."""
        with guard("read a fan-in"):
            snapshot = self.root(join_id).get(**self.runs.call_options)
            return self._summed(join_id, snapshot.to_dict()) if snapshot.exists else None

    def progress(self, join_id: str) -> Progress | None:
        """:meth:`FanInStore.fan_in_progress`: from the root alone (one read, no shards)."""
        with guard("read a fan-in's progress"):
            snapshot = self.root(join_id).get(**self.runs.call_options)
            return _progress_of(join_id, snapshot) if snapshot.exists else None

    def _summed(self, join_id: str, root: dict[str, Any] | None) -> FanInRecord:
        shards = self.shards_of(join_id).stream(timeout=self.runs.call_timeout)
        return rules.summed(_root(join_id, root), [_shard(join_id, s.to_dict()) for s in shards])

    def entries(self, join_id: str, after: str | None, limit: int) -> list[ChildEntry]:
        """:meth:`FanInStore.fan_in_entries`: ordered by the ``key`` field (its automatic
        single-field index)."""
        query: Any = self.entries_of(join_id)
        if after is not None:
            query = query.where(filter=firestore.FieldFilter("key", ">", after))
        query = query.order_by("key").limit(limit)
        with guard("read a fan-in's entries"):
            return [
                _entry(join_id, snapshot.to_dict())
                for snapshot in query.stream(timeout=self.runs.call_timeout)
            ]

    def of_parent(self, parent_run_id: str, limit: int) -> list[FanInRecord]:
        """:meth:`FanInStore.fan_ins_of`: one equality filter (no composite index), ordered
        here, as a run fans out few joins; each summed over its shards."""
        query = self.roots.where(filter=firestore.FieldFilter("parent_run_id", "==", parent_run_id))
        with guard("list a run's fan-ins"):
            found = list(query.stream(timeout=self.runs.call_timeout))
            found.sort(key=lambda s: (utc(s.get("created_at")), s.id), reverse=True)
            return [self._summed(s.id, s.to_dict()) for s in found[:limit]]

    # --- Writes beside a child's finish ---------------------------------------------

    def mark_then_enqueued(self, join_id: str, now: datetime) -> None:
        """:meth:`FanInStore.mark_then_enqueued`: an update conditional on the root's version
        read, kept if another was first."""
        ref = self.root(join_id)
        call = self.runs.call_options
        with guard("note a fan-in's then task"):
            for _ in range(MAX_ROUNDS):
                snapshot = ref.get(**call)
                data = snapshot.to_dict() if snapshot.exists else None
                if data is None or data.get("then_enqueued_at") is not None:
                    return
                option = self.runs.client.write_option(last_update_time=snapshot.update_time)
                try:
                    ref.update({"then_enqueued_at": now}, option=option, **call)
                except (api.FailedPrecondition, api.NotFound, api.Aborted):
                    continue  # Changed under us: read it again.
                return
        raise StoreUnavailable(f"fan-in {join_id}: too much contention to note its then task")

    def purge(self, now: datetime) -> int:
        """Delete the joins whose root and shards have all expired, then their entries;
        return how many. The root and shards go in one Commit, each only at the version read,
        so a child counted meanwhile (it writes its shard, and the root if it makes a shard)
        keeps its join. A purge stopped before the entries leaves them to their TTL policy."""
        expired = self.roots.where(filter=firestore.FieldFilter("expire_at", "<=", now))
        purged = 0
        with guard("purge expired fan-ins"):
            for root in list(expired.stream(timeout=self.runs.call_timeout)):
                if self._delete_if_expired(root, now):
                    self._delete_all(self.entries_of(root.id))
                    purged += 1
        return purged

    def _delete_if_expired(self, root: Any, now: datetime) -> bool:
        client = self.runs.client
        shards = list(self.shards_of(root.id).stream(timeout=self.runs.call_timeout))
        documents = [root, *shards]
        if any(_expiry(document.to_dict()) > now for document in documents):
            return False
        batch = client.batch()
        for document in documents:
            option = client.write_option(last_update_time=document.update_time)
            batch.delete(document.reference, option=option)
        try:
            batch.commit(**self.runs.call_options)
        except _REFUSED:
            return False  # Counted meanwhile: the next purge decides again.
        return True

    def _delete_all(self, collection: Any) -> None:
        client = self.runs.client
        while True:
            page = list(collection.limit(_BATCH).stream(timeout=self.runs.call_timeout))
            if not page:
                return
            batch = client.batch()
            for snapshot in page:
                batch.delete(snapshot.reference)
            batch.commit(**self.runs.call_options)

    # --- Documents ------------------------------------------------------------------

    @property
    def roots(self) -> Any:
        return self.runs.client.collection(root_collection(self.runs.collection))

    def root(self, join_id: str) -> Any:
        return self.roots.document(join_id)

    def shards_of(self, join_id: str) -> Any:
        return self.root(join_id).collection(shard_collection(self.runs.collection))

    def entries_of(self, join_id: str) -> Any:
        return self.root(join_id).collection(entry_collection(self.runs.collection))


def entry_id(key: str) -> str:
    """An entry's document id: any key, whatever its characters or length, as a valid id."""
    return hashlib.sha256(key.encode()).hexdigest()


def _progress_of(join_id: str, root: Any) -> Progress:
    """The join's progress as a read of its root shows it."""
    if not root.exists:
        return Progress(join_id, closed=False, then_enqueued=False)
    return _progress(_root(join_id, root.to_dict()))


def _progress(root: FanInRecord) -> Progress:
    return Progress(
        root.join_id,
        closed=root.shards_done >= root.shards,
        then_enqueued=root.then_enqueued_at is not None,
    )


def _expiry(data: dict[str, Any] | None) -> datetime:
    return utc((data or {})["expire_at"])


def _time_or_none(value: Any) -> datetime | None:
    return None if value is None else utc(value)


def _root_fields(root: FanInRecord) -> dict[str, Any]:
    """The root's fields: its counts are its shards'."""
    return {
        "parent_run_id": root.parent_run_id,
        "then": root.then,
        "expected": root.expected,
        "shards": root.shards,
        "shards_done": root.shards_done,
        "created_at": root.created_at,
        "expire_at": root.expire_at,
        "then_enqueued_at": root.then_enqueued_at,
    }


def _root(join_id: str, data: dict[str, Any] | None) -> FanInRecord:
    data = data or {}
    return FanInRecord(
        join_id,
        str(data["parent_run_id"]),
        str(data["then"]),
        int(data["expected"]),
        utc(data["created_at"]),
        utc(data["expire_at"]),
        shards=int(data["shards"]),
        shards_done=int(data["shards_done"]),
        then_enqueued_at=_time_or_none(data.get("then_enqueued_at")),
    )


def _shard_fields(shard: ShardRecord, expire_at: datetime) -> dict[str, Any]:
    return {
        "shard": shard.shard,
        "expected": shard.expected,
        "completed": shard.completed,
        "failed": shard.failed,
        "expire_at": expire_at,
    }


def _shard(join_id: str, data: dict[str, Any] | None) -> ShardRecord:
    data = data or {}
    return ShardRecord(
        join_id,
        int(data["shard"]),
        int(data["expected"]),
        completed=int(data["completed"]),
        failed=int(data["failed"]),
    )


def _entry_fields(entry: ChildEntry, expire_at: datetime) -> dict[str, Any]:
    return {
        "key": entry.key,
        "run_id": entry.run_id,
        "status": entry.status.value,
        "finished_at": entry.finished_at,
        "result": entry.result_json,
        "error": entry.error,
        "shard": entry.shard,
        "expire_at": expire_at,
    }


def _entry(join_id: str, data: dict[str, Any] | None) -> ChildEntry:
    data = data or {}
    return ChildEntry(
        join_id,
        str(data["key"]),
        str(data["run_id"]),
        RunStatus(data["status"]),
        utc(data["finished_at"]),
        data.get("result"),
        data.get("error"),
        int(data.get("shard", 0)),
    )
