"""Counting this process's deliveries per handler, minute and outcome, and writing the counts
to a :class:`~tasklease.worker.stores.delivery_tally.DeliveryTally` store.

A delivery only adds one to a counter in memory. A daemon thread (started on the first count
in each process: threads do not survive a fork) writes the process's counts every
``interval`` seconds, in one write, and once more at exit. A failed write is logged and its
counts kept for the next one; as a write holds totals, never increments, writing them again
cannot count twice. A delivery never waits for the store here, and never fails for it.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import uuid
import weakref
from collections import Counter
from collections.abc import Callable
from datetime import datetime

from tasklease.worker.logs import instance_id
from tasklease.worker.stores.delivery_tally import TALLY_KEPT, DeliveryTally, TallyKey, minute_of

_log = logging.getLogger("tasklease.tally")

FLUSH_INTERVAL = 60.0  # Seconds: at most one write a minute per process.


class DeliveryCounter:
    """One process's delivery counts, flushed to ``store`` in the background."""

    def __init__(
        self,
        store: DeliveryTally,
        clock: Callable[[], datetime],
        *,
        interval: float = FLUSH_INTERVAL,
    ) -> None:
        self.store = store
        self.clock = clock
        self.interval = interval
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._pending: dict[datetime, Counter[TallyKey]] = {}
        self._written: dict[datetime, Counter[TallyKey]] = {}  # What the store holds.
        self.instance = ""
        self._stop = threading.Event()

    def count(self, kind: str, handler: str, outcome: str) -> None:
        """Count one delivery now (called on the delivery's path: memory only)."""
        minute = minute_of(self.clock())
        with self._lock:
            if self._pid != os.getpid():
                self._start()
            self._pending.setdefault(minute, Counter())[TallyKey(kind, handler, outcome)] += 1

    def flush(self) -> bool:
        """Write the minutes whose counts changed since the last write; False when the store
        failed (they are kept, and written with the next)."""
        with self._lock:
            changed = {
                minute: Counter(counts)
                for minute, counts in self._pending.items()
                if self._written.get(minute) != counts
            }
            instance = self.instance
        if not changed:
            return True
        try:
            self.store.write_delivery_counts(instance, changed)
        except Exception:  # The store's StoreUnavailable, or a bug: never a delivery's.
            _log.warning("writing delivery counts failed; kept for the next write", exc_info=True)
            self._forget_before(minute_of(self.clock()) - TALLY_KEPT, written_only=False)
            return False
        with self._lock:
            self._written.update(changed)
        self._forget_before(minute_of(self.clock()))
        return True

    def close(self) -> None:
        """Stop the thread and write what is left."""
        self._stop.set()
        if self._pid == os.getpid():
            self.flush()

    def _forget_before(self, current: datetime, *, written_only: bool = True) -> None:
        """Drop the minutes before ``current`` whose counts were written (deliveries count in
        their own minute, so those are final), or any (``written_only`` False: older than the
        store keeps, while it is down)."""
        with self._lock:
            for minute in [m for m in self._pending if m < current]:
                if not written_only or self._written.get(minute) == self._pending[minute]:
                    del self._pending[minute]
            self._written = {m: c for m, c in self._written.items() if m in self._pending}

    def _start(self) -> None:
        """In a new process (the first, or a forked child): own counts, own instance, own
        thread. Under ``self._lock``."""
        self._pid = os.getpid()
        self._pending = {}
        self._written = {}
        self.instance = f"{instance_id()}/{uuid.uuid4().hex[:8]}"  # A reused pid is new.
        self._stop = threading.Event()
        me = weakref.ref(self)  # The thread and atexit must not keep a dropped app alive.
        thread = threading.Thread(
            target=_flush_every, args=(me, self.interval, self._stop), name="tasklease-tally"
        )
        thread.daemon = True
        thread.start()
        atexit.register(_close, me)


def _flush_every(
    counter: weakref.ref[DeliveryCounter], interval: float, stop: threading.Event
) -> None:
    while not stop.wait(interval):
        alive = counter()
        if alive is None:
            return
        alive.flush()
        del alive


def _close(counter: weakref.ref[DeliveryCounter]) -> None:
    alive = counter()
    if alive is not None:
        alive.close()
