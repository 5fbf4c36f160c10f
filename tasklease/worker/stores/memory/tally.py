"""The memory store's delivery tally: counts in a dict behind a lock."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime

from tasklease.worker.stores.base.tally import MinuteCounts, TallyKey, merge, minute_of


class TallyTable:
    """Each instance's totals per minute and key (see :class:`DeliveryTally`)."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, datetime], dict[TallyKey, int]] = {}
        self._lock = threading.Lock()

    def write(self, instance: str, counts: MinuteCounts) -> None:
        with self._lock:
            for minute, keyed in counts.items():
                self._counts.setdefault((instance, minute_of(minute)), {}).update(keyed)

    def read(self, since: datetime) -> dict[datetime, Counter[TallyKey]]:
        start = minute_of(since)
        with self._lock:
            rows = [(m, dict(keyed)) for (_, m), keyed in self._counts.items() if m >= start]
        answer: dict[datetime, Counter[TallyKey]] = {}
        for minute, keyed in rows:
            for key, n in keyed.items():
                merge(answer, minute, key, n)
        return answer

    def purge(self, before: datetime) -> int:
        with self._lock:
            old = [slot for slot in self._counts if slot[1] < before]
            for slot in old:
                del self._counts[slot]
        return len(old)
