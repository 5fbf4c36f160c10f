"""An in-process store with the full contract: for tests, and users' own tests."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from tasklease.joins import Member
from tasklease.worker.core import locking
from tasklease.worker.core.fan_in import ChildEntry, FanInRecord, Progress
from tasklease.worker.core.records import LockRecord, RunRecord, RunStatus
from tasklease.worker.stores.base.codec import Conversion, RecordCodec
from tasklease.worker.stores.base.fan_ins import FanInStore, count_member_in
from tasklease.worker.stores.base.locks import LockStore
from tasklease.worker.stores.base.queries import OperatorQueries
from tasklease.worker.stores.base.store import Change, LockChange, Moment, resolve
from tasklease.worker.stores.base.tally import TALLY_KEPT, DeliveryTally, MinuteCounts, TallyKey
from tasklease.worker.stores.memory.tally import TallyTable

if TYPE_CHECKING:
    from tasklease.worker.core.queries import Position, RunFilter

_T = TypeVar("_T")
# Identity as a sorted tuple of pairs, status as its value: enum members, dicts and
# dataclasses are tracked objects; strings and tuples of them are not (see MemoryStore).
_CODEC = RecordCodec(RunRecord, mapping=Conversion(lambda m: tuple(sorted(m.items())), dict))

Packed = tuple[Any, ...]


class MemoryStore(LockStore, FanInStore, OperatorQueries, DeliveryTally):
    """Records in a dict behind one lock. Shared by the threads of one process only.

    Records are kept as flat tuples of immutable values, which Python's cycle collector stops
    tracking: a store of many thousand records then costs the collector nothing, where as many
    dataclasses and dicts would slow every collection (and so every request) as it grew.
    """

    shared_across_instances: ClassVar[bool] = False  # One process / one machine's disk.

    def __init__(self) -> None:
        self._records: dict[str, Packed] = {}
        self._locks: dict[str, LockRecord] = {}  # Few: one per exclusive job or busy key.
        self._joins = _Joins()
        self._lock = threading.Lock()
        self.tally = TallyTable()  # The DeliveryTally methods delegate to it.

    def _read_modify_write(self, run_id: str, change: Change[_T]) -> _T:
        with self._lock:
            packed = self._records.get(run_id)
            new_record, value = change(None if packed is None else _unpack(packed))
            if new_record is not None:
                self._records[run_id] = _pack(new_record)
            return value

    def _read_modify_write_lock(self, name: str, change: LockChange[_T]) -> _T:
        def read(run_id: str) -> RunRecord | None:  # Under self._lock, like the change.
            packed = self._records.get(run_id)
            return None if packed is None else _unpack(packed)

        with self._lock:
            new_lock, value = change(self._locks.get(name), read)
            if new_lock is not None:
                self._locks[name] = new_lock
            return value

    def _read_modify_write_member(
        self, run_id: str, member: Member, change: Change[_T], now: Moment, keep_for: timedelta
    ) -> tuple[_T, Progress]:
        with self._lock:
            packed = self._records.get(run_id)
            stored = None if packed is None else _unpack(packed)
            new_record, value = change(stored)
            if new_record is not None:
                self._records[run_id] = _pack(new_record)
            after = new_record if new_record is not None else stored
            return value, count_member_in(self._joins, after, member, resolve(now), keep_for)

    def get_fan_in(self, join_id: str) -> FanInRecord | None:
        with self._lock:
            return self._joins.join(join_id)

    def fan_in_entries(
        self, join_id: str, after: str | None = None, limit: int = 1000
    ) -> list[ChildEntry]:
        with self._lock:
            entries = list(self._joins.entries.get(join_id, {}).values())
        entries = [e for e in entries if after is None or e.key > after]
        return sorted(entries, key=lambda e: e.key)[:limit]

    def fan_ins_of(self, parent_run_id: str, limit: int = 100) -> list[FanInRecord]:
        with self._lock:
            joins = [j for j in self._joins.joins.values() if j.parent_run_id == parent_run_id]
        return sorted(joins, key=lambda j: (j.created_at, j.join_id), reverse=True)[:limit]

    def mark_then_enqueued(self, join_id: str, now: datetime) -> None:
        with self._lock:
            join = self._joins.join(join_id)
            if join is not None and join.then_enqueued_at is None:
                self._joins.put_join(join.replace(then_enqueued_at=now))

    def get_lock(self, name: str) -> LockRecord | None:
        with self._lock:
            return self._locks.get(name)

    def list_locks(self, limit: int = 100) -> list[LockRecord]:
        with self._lock:
            locks = list(self._locks.values())
        return sorted(locks, key=lambda lock: (lock.started_at, lock.name), reverse=True)[:limit]

    def get(self, run_id: str) -> RunRecord | None:
        with self._lock:
            packed = self._records.get(run_id)
        return None if packed is None else _unpack(packed)

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        with self._lock:
            records = [_unpack(packed) for packed in self._records.values()]
        records = [r for r in records if status is None or r.status is status]
        return sorted(records, key=lambda r: r.claimed_at, reverse=True)[:limit]

    def purge_expired(self, now: datetime) -> int:
        with self._lock:
            expired = [
                key for key, packed in self._records.items() if _unpack(packed).expire_at <= now
            ]
            for key in expired:
                del self._records[key]
            lapsed = [name for name, lock in self._locks.items() if locking.lapses_at(lock) <= now]
            for name in lapsed:
                del self._locks[name]
            joins = self._joins.purge(now)
        return len(expired) + len(lapsed) + joins + self.purge_delivery_counts(now - TALLY_KEPT)

    def write_delivery_counts(self, instance: str, counts: MinuteCounts) -> None:
        self.tally.write(instance, counts)

    def delivery_counts(self, since: datetime) -> dict[datetime, Counter[TallyKey]]:
        return self.tally.read(since)

    def purge_delivery_counts(self, before: datetime) -> int:
        return self.tally.purge(before)

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._records)} records)"

    # --- Operations: listing and lookup ------------------------------------------

    def _scan_runs(self, filters: RunFilter, after: Position | None, limit: int) -> list[RunRecord]:
        with self._lock:
            records = [_unpack(packed) for packed in self._records.values()]
        from tasklease.worker.core.queries import before  # noqa: PLC0415 - listing only.

        matching = [r for r in records if before(r, after) and filters.matches(r)]
        return sorted(matching, key=lambda r: (r.claimed_at, r.run_id), reverse=True)[:limit]

    def _find_by_identity(self, name: str, value: str) -> list[RunRecord]:
        with self._lock:
            records = [_unpack(packed) for packed in self._records.values()]
        return [r for r in records if r.identity.get(name) == value]


class _Joins:
    """The joins and their entries (read and written under the store's lock)."""

    def __init__(self) -> None:
        self.joins: dict[str, FanInRecord] = {}
        self.entries: dict[str, dict[str, ChildEntry]] = {}

    def join(self, join_id: str) -> FanInRecord | None:
        return self.joins.get(join_id)

    def has_entry(self, join_id: str, key: str) -> bool:
        return key in self.entries.get(join_id, {})

    def add_entry(self, entry: ChildEntry) -> None:
        self.entries.setdefault(entry.join_id, {})[entry.key] = entry

    def put_join(self, join: FanInRecord) -> None:
        self.joins[join.join_id] = join

    def purge(self, now: datetime) -> int:
        expired = [j.join_id for j in self.joins.values() if j.expire_at <= now]
        for join_id in expired:
            del self.joins[join_id]
            self.entries.pop(join_id, None)
        return len(expired)


def _pack(record: RunRecord) -> Packed:
    return tuple(_CODEC.encode(record))


def _unpack(packed: Packed) -> RunRecord:
    return _CODEC.decode(packed)
