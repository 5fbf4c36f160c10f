"""Keeps the leases of running executions alive, from one background thread per process."""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from worker.context import TaskContext
from worker.errors import StoreUnavailable
from worker.stores.base import LeaseStore

_log = logging.getLogger("tasklease.lease")

# Renew this many times per lease: a renewal that fails once still leaves time for another.
RENEWALS_PER_LEASE = 3


@dataclass(order=True)
class _Entry:
    due: float
    sequence: int
    ctx: TaskContext = field(compare=False)
    lease: timedelta = field(compare=False)
    active: bool = field(default=True, compare=False)


class LeaseKeeper:
    """Renews each registered execution's lease about every ``lease / 3``.

    A renewal that finds the claim gone (another attempt took the run over after this one's
    lease expired) marks the context lost and stops; a renewal the store cannot answer is
    retried sooner. The thread starts on first use and again after a fork.
    """

    def __init__(self, store: LeaseStore, clock: Callable[[], datetime]) -> None:
        self._store = store
        self._clock = clock
        self._sequence = itertools.count()
        self._pid: int | None = None
        self._condition = threading.Condition()
        self._heap: list[_Entry] = []

    @contextmanager
    def kept(self, ctx: TaskContext, lease: timedelta) -> Iterator[None]:
        """Renew ``ctx``'s lease for as long as the ``with`` block runs."""
        entry = _Entry(time.monotonic() + _interval(lease), next(self._sequence), ctx, lease)
        self._start_if_needed()
        with self._condition:
            heapq.heappush(self._heap, entry)
            self._condition.notify()
        try:
            yield
        finally:
            entry.active = False  # Dropped from the heap when it comes due.

    def _start_if_needed(self) -> None:
        if self._pid == os.getpid():
            return
        with self._condition:
            if self._pid == os.getpid():
                return
            # After a fork the parent's thread does not exist here: start afresh.
            self._condition = threading.Condition()
            self._heap = []
            self._pid = os.getpid()
            threading.Thread(target=self._run, name="tasklease-lease-keeper", daemon=True).start()

    def _run(self) -> None:
        while True:
            entry = self._next_due()
            if entry.active:
                retry_in = self._renew(entry)
                if retry_in is not None:
                    with self._condition:
                        entry.due = time.monotonic() + retry_in
                        heapq.heappush(self._heap, entry)

    def _next_due(self) -> _Entry:
        with self._condition:
            while True:
                if not self._heap:
                    self._condition.wait()
                    continue
                wait = self._heap[0].due - time.monotonic()
                if wait <= 0:
                    return heapq.heappop(self._heap)
                self._condition.wait(wait)

    def _renew(self, entry: _Entry) -> float | None:
        """Renew once; return seconds until the next renewal, or None to stop."""
        ctx = entry.ctx
        lease_expires = self._clock() + entry.lease
        try:
            held = self._store.renew(ctx.run_id, ctx.attempt_id, lease_expires)
        except StoreUnavailable as exc:
            _log.warning("lease renewal of run %s failed, retrying: %s", ctx.run_id, exc)
            return max(_interval(entry.lease) / 4, 0.2)
        except Exception:
            _log.exception("lease renewal of run %s failed unexpectedly, retrying", ctx.run_id)
            return max(_interval(entry.lease) / 4, 0.2)
        if not held:
            if not entry.active:
                return None  # The execution finished meanwhile: its own finish ended the claim.
            ctx.mark_lease_lost()
            _log.warning(
                "run %s: attempt %s lost its claim; another attempt took the run over",
                ctx.run_id,
                ctx.attempt_id,
            )
            return None
        ctx.lease_expires = lease_expires
        return _interval(entry.lease)


def _interval(lease: timedelta) -> float:
    return lease.total_seconds() / RENEWALS_PER_LEASE
