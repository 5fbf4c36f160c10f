"""An in-process store with the full contract: for tests, and users' own tests."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import TypeVar

from worker.records import RunRecord, RunStatus
from worker.stores.base import Change, LeaseStore

_T = TypeVar("_T")


class MemoryStore(LeaseStore):
    """Records in a dict behind one lock. Shared by the threads of one process only."""

    def __init__(self) -> None:
        self._records: dict[str, RunRecord] = {}
        self._lock = threading.Lock()

    def _read_modify_write(self, run_id: str, change: Change[_T]) -> _T:
        with self._lock:
            new_record, value = change(self._records.get(run_id))
            if new_record is not None:
                self._records[run_id] = new_record
            return value

    def get(self, run_id: str) -> RunRecord | None:
        with self._lock:
            return self._records.get(run_id)

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        with self._lock:
            records = [r for r in self._records.values() if status is None or r.status is status]
        return sorted(records, key=lambda r: r.claimed_at, reverse=True)[:limit]

    def purge_expired(self, now: datetime) -> int:
        with self._lock:
            expired = [key for key, r in self._records.items() if r.expire_at <= now]
            for key in expired:
                del self._records[key]
            return len(expired)

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._records)} records)"
