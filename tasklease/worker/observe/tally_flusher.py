"""Counting this process's deliveries per handler, minute and outcome, and writing the counts
to a :class:`~tasklease.worker.stores.base.tally.DeliveryTally` store.

A delivery only adds one to a counter in memory. One daemon thread per process (started on
the first count in it: threads do not survive a fork) writes each counter's counts every
``interval`` seconds, in one write, and once more at exit (for at most
:data:`EXIT_FLUSH_TIMEOUT` seconds, on that same thread). A failed write is logged and its
counts kept for the next one; as a write holds totals, never increments, writing them again
cannot count twice. A delivery never waits for the store here, and never fails for it.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

from tasklease.worker.observe.logs import instance_id
from tasklease.worker.stores.base.tally import TALLY_KEPT, DeliveryTally, TallyKey, minute_of

_log = logging.getLogger("tasklease.tally")

FLUSH_INTERVAL = 60.0  # Seconds: at most one write a minute per process.
# How long the exit waits for the last write: a store that is down must not hold it up.
EXIT_FLUSH_TIMEOUT = 2.0


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
        self._flushing = threading.Lock()
        self._pid: int | None = None
        self._pending: dict[datetime, Counter[TallyKey]] = {}
        self._written: dict[datetime, Counter[TallyKey]] = {}  # What the store holds.
        self.instance = ""
        self._closed = False
        self.next_flush = 0.0  # Monotonic seconds.
        self._minute: tuple[datetime, datetime] | None = None

    def count(self, kind: str, handler: str, outcome: str) -> None:
        """Count one delivery now (called on the delivery's path: memory only)."""
        now = self.clock()
        last = self._minute  # The minute of the last count, and its end.
        if last is not None and now.tzinfo is not None and last[0] <= now < last[1]:
            minute = last[0]
        else:
            minute = minute_of(now)
            self._minute = (minute, minute + timedelta(minutes=1))
        with self._lock:
            if self._pid != os.getpid():
                self._start()
            self._pending.setdefault(minute, Counter())[TallyKey(kind, handler, outcome)] += 1

    def flush(self) -> bool:
        """Write the minutes whose counts changed since the last write; False when the store
        failed (they are kept, and written with the next). One flush at a time: an older
        snapshot written after a newer one would lower the stored totals."""
        with self._flushing:
            return self._flush()

    def _flush(self) -> bool:
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
        """Write what is left, and stop flushing."""
        if self._pid == os.getpid() and not self._closed:
            self.flush()
        self._closed = True

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
        """In a new process (the first, or a forked child): own counts, own instance, and
        the process's flusher thread told of it. Under ``self._lock``."""
        self._pid = os.getpid()
        self._pending = {}
        self._written = {}
        self.instance = f"{instance_id()}/{uuid.uuid4().hex[:8]}"  # A reused pid is new.
        self._closed = False
        self.next_flush = time.monotonic() + self.interval
        _FLUSHER.watch(self)

    def due(self, now: float) -> bool:
        """Whether a flush is due at ``now`` (monotonic seconds); if so, the next is set."""
        if self._closed or now < self.next_flush:
            return False
        self.next_flush = now + self.interval
        return True


class _Flusher:
    """The one thread per process that flushes every live counter when it is due. It holds
    the counters weakly: a dropped app's counter (a test's) is not kept alive by it."""

    def __init__(self) -> None:
        self._counters: weakref.WeakSet[DeliveryCounter] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._pid: int | None = None
        self._wake = threading.Event()
        self._exiting = threading.Event()  # Set by close_all: the thread's last flush.
        self._exited = threading.Event()  # Set by the thread when that flush is done.

    def watch(self, counter: DeliveryCounter) -> None:
        with self._lock:
            self._counters.add(counter)
            if self._pid != os.getpid():  # Threads do not survive a fork: start one here.
                self._pid = os.getpid()
                self._exiting, self._exited = threading.Event(), threading.Event()
                thread = threading.Thread(target=self._run, name="tasklease-tally", daemon=True)
                thread.start()
        self._wake.set()  # Its interval may be shorter than the thread's current wait.

    def close_all(self, timeout: float = EXIT_FLUSH_TIMEOUT) -> None:
        """At exit: write what every counter of this process has left, waiting at most
        ``timeout`` seconds (a store that is down must not hold up a shutdown). The flusher
        thread writes it: Python 3.12 refuses to start a thread from an atexit callback
        (docs.python.org/3.12/whatsnew/3.12.html, "can't create new thread at interpreter
        shutdown"), and a daemon thread still runs while the callbacks do."""
        with self._lock:
            if self._pid != os.getpid() or not self._counters:
                return
            exiting, exited = self._exiting, self._exited
        exiting.set()
        self._wake.set()
        if not exited.wait(timeout):
            _log.warning("delivery counts not written within %.0f s of exit: dropped", timeout)

    def _run(self) -> None:
        while not self._exiting.is_set():
            now = time.monotonic()
            with self._lock:
                counters = list(self._counters)
            for counter in counters:
                if counter.due(now):
                    counter.flush()
            pause = min((c.next_flush - now for c in counters), default=FLUSH_INTERVAL)
            del counters
            self._wake.wait(max(pause, 0.01))
            self._wake.clear()
        with self._lock:
            counters = list(self._counters)
        for counter in counters:
            counter.close()
        self._exited.set()


_FLUSHER = _Flusher()
atexit.register(_FLUSHER.close_all)  # Inherited by forked children, which run it as theirs.
