"""Keeps the leases of running executions alive while their handlers run.

One scheduler thread knows when each lease is due for renewal; each renewal runs on a thread
of its own (daemon, so a renewal stuck on a dead store never holds up the process's exit), so a
renewal stuck on the store for one run never delays another run's. A run has at most one
renewal in flight: the next is scheduled when the last one ends.
An attempt whose renewals fail is not kept alive by hope: its context counts the lease as
lost once the lease it last confirmed runs out by the local monotonic clock
(:attr:`TaskContext.lease_lost`, which reads its :class:`Attempt`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from tasklease.errors import StoreUnavailable
from tasklease.worker.core.endings import HandlerNotStarted
from tasklease.worker.handlers.attempt import Attempt
from tasklease.worker.observe import telemetry
from tasklease.worker.stores.base.locks import lock_store
from tasklease.worker.stores.base.store import LeaseStore

_log = logging.getLogger("tasklease.lease")

# Renew this many times per lease: a renewal that fails once still leaves time for another.
RENEWALS_PER_LEASE = 3
# Longest sleep of the scheduler thread with nothing to renew.
IDLE_WAKE = 1.0
# Shortest pause before retrying a renewal the store could not answer.
MIN_RETRY_PAUSE = 0.05


class KeeperNotStarted(HandlerNotStarted):
    """The scheduler thread could not be started: no lease would be renewed, so the
    execution must not begin (its claim is given back without counting the attempt)."""


@dataclass
class _Entry:
    live: Attempt
    lease: timedelta
    keep_for: timedelta | None = None


class KeepsLeases(Protocol):
    """What the executor needs of a lease keeper: renewals while a ``with`` block runs."""

    def kept(
        self, live: Attempt, lease: timedelta, *, keep_for: timedelta | None = None
    ) -> AbstractContextManager[None]:
        """Renew ``live``'s lease while the block runs (see :meth:`LeaseKeeper.kept`)."""
        ...


class LeaseKeeper:
    """Renews each registered execution's lease about every ``lease / 3``.

    A renewal that finds the claim gone (another attempt took the run over) marks the attempt
    lost and stops; one the store cannot answer is retried sooner, until the lease confirmed
    last runs out locally. Threads start on first use and again after a fork.
    """

    def __init__(self, store: LeaseStore, clock: Callable[[], datetime]) -> None:
        self._store = store
        self._clock = clock
        self._sequence = itertools.count()
        self._pid: int | None = None  # The process whose scheduler thread runs.
        self._state_pid: int | None = None  # The process the state below belongs to.
        self._condition = threading.Condition()
        self._entries: dict[int, _Entry] = {}  # Executions still running, by sequence number.
        self._due: list[tuple[float, int]] = []  # (monotonic due time, sequence), a heap.
        self._wakes_at = math.inf  # When the scheduler thread's current wait ends.

    @property
    def kept_count(self) -> int:
        """How many executions the keeper holds now (finished ones leave at once)."""
        with self._condition:
            return len(self._entries)

    @contextmanager
    def kept(
        self, live: Attempt, lease: timedelta, *, keep_for: timedelta | None = None
    ) -> Iterator[None]:
        """Renew ``live``'s lease for as long as the ``with`` block runs; each renewal keeps
        the record at least ``keep_for`` (the handler's retention) past the new lease.
        Raises :class:`KeeperNotStarted` on entry if the keeper's thread cannot start."""
        self._start_if_needed()
        sequence = next(self._sequence)
        # Counted from when the claim the attempt holds was confirmed (before its store call).
        due = first_renewal_due(live, lease, time.monotonic())
        with self._condition:
            self._entries[sequence] = _Entry(live, lease, keep_for)
            self._schedule(due, sequence)
        try:
            yield
        finally:
            with self._condition:
                del self._entries[sequence]
                # Drop stale heap slots once they outnumber the live ones.
                if len(self._due) > 2 * len(self._entries) + 64:
                    self._due = [slot for slot in self._due if slot[1] in self._entries]
                    heapq.heapify(self._due)

    def _schedule(self, due: float, sequence: int) -> None:
        """Call with the condition held."""
        heapq.heappush(self._due, (due, sequence))
        if due < self._wakes_at:
            # Wake the scheduler only when it would otherwise sleep past this renewal: most
            # executions end long before their first renewal, and a wake-up per request costs.
            self._condition.notify()

    def _start_if_needed(self) -> None:
        """Start the scheduler thread unless it runs in this process. A start that fails is
        tried again at the next use; until one succeeds no execution may begin."""
        if self._pid == os.getpid():
            return
        with self._condition:
            pid = os.getpid()
            if self._pid == pid:
                return
            if self._state_pid != pid:
                # After a fork the parent's threads do not exist here: start afresh.
                self._condition = threading.Condition()
                self._entries = {}
                self._due = []
                self._state_pid = pid
            try:
                threading.Thread(
                    target=self._run, name="tasklease-lease-keeper", daemon=True
                ).start()
            except Exception as exc:  # e.g. "can't start new thread"
                _log.error("could not start the lease keeper's thread: %s", exc)
                raise KeeperNotStarted(f"the lease keeper could not start: {exc}") from exc
            # Recorded only once the thread runs: a failed start leaves it to the next use.
            self._pid = pid

    def _run(self) -> None:
        while True:
            sequence = self._next_due()
            with self._condition:
                entry = self._entries.get(sequence)
            if entry is None:
                continue
            try:
                threading.Thread(
                    target=self._renew_and_reschedule,
                    args=(sequence, entry),
                    name=f"tasklease-renew-{entry.live.run_id[:12]}",
                    daemon=True,
                ).start()
            except Exception:  # e.g. "can't start new thread": this loop must live on.
                _log.exception("could not start the renewal of run %s; retrying", entry.live.run_id)
                with self._condition:
                    if sequence in self._entries:
                        self._schedule(time.monotonic() + MIN_RETRY_PAUSE, sequence)

    def _next_due(self) -> int:
        with self._condition:
            while True:
                now = time.monotonic()
                while self._due and self._due[0][1] not in self._entries:
                    heapq.heappop(self._due)  # Finished executions' slots.
                if not self._due:
                    # Idle: wake now and then anyway, so that a new execution (due a lease/3
                    # away at the soonest) needs to wake this thread only if due sooner.
                    self._wakes_at = now + IDLE_WAKE
                    self._condition.wait(IDLE_WAKE)
                    continue
                due = self._due[0][0]
                if due <= now:
                    self._wakes_at = now
                    return heapq.heappop(self._due)[1]
                self._wakes_at = due
                self._condition.wait(due - now)

    def _renew_and_reschedule(self, sequence: int, entry: _Entry) -> None:
        next_in = self._renew(sequence, entry)
        if next_in is None:
            return
        with self._condition:
            if sequence in self._entries:
                self._schedule(time.monotonic() + next_in, sequence)

    def _renew(self, sequence: int, entry: _Entry) -> float | None:
        """Renew once; return seconds until the next renewal, or None to stop."""

        def still_kept() -> bool:
            with self._condition:
                return sequence in self._entries

        return renew_once(
            self._store,
            self._clock,
            entry.live,
            entry.lease,
            keep_for=entry.keep_for,
            still_kept=still_kept,
        )


def first_renewal_due(live: Attempt, lease: timedelta, now: float) -> float:
    """When (in ``live``'s monotonic time) the first renewal of the lease it holds is due:
    a third of the lease after the claim was confirmed, or after ``now`` if unconfirmed."""
    deadline = live.lease_deadline
    if math.isfinite(deadline):
        return deadline - lease.total_seconds() + _interval(lease)
    return now + _interval(lease)


def renew_once(
    store: LeaseStore,
    clock: Callable[[], datetime],
    live: Attempt,
    lease: timedelta,
    *,
    keep_for: timedelta | None,
    still_kept: Callable[[], bool],
) -> float | None:
    """Renew ``live``'s lease, and the lock it holds, once: seconds until the next renewal,
    or None to stop (the claim is gone, or the confirmed lease ran out before the store
    answered). ``still_kept()`` tells a loss from the attempt's own finish meanwhile.
    The renewal logic of every keeper: the threads of :class:`LeaseKeeper`, or a
    simulation's virtual timers."""
    if live.lease_lost:
        return None
    asked_at, asked = clock(), live.timing.monotonic()
    try:
        renewed = store.renew_run(live.run_id, live.attempt_id, lease, clock, keep_for=keep_for)
        lease_expires = None if renewed is None else renewed.lease_expires
        if renewed is not None:
            live.note_record(renewed)  # A cancellation: the handler's next step stops it.
        # The lock (exclusive job, concurrency key) shares the run's lease: losing either
        # is losing the lease. Renewed second, it never expires before the run's.
        lock = live.lock
        if (
            lease_expires is not None
            and lock is not None
            and lock_store(store).renew_lock(lock, live.attempt_id, lease, clock) is None
        ):
            lease_expires = None
    except Exception as exc:
        # StoreUnavailable is expected; anything else is a bug in a store, but the
        # execution must still stop in time, so both are retried until the deadline.
        telemetry.lease_renewed(live.handler, renewed=False)
        level = logging.WARNING if isinstance(exc, StoreUnavailable) else logging.ERROR
        left = live.lease_seconds_left
        _log.log(
            level,
            "lease renewal of run %s failed (%s); %.1f s of confirmed lease left",
            live.run_id,
            exc,
            left,
        )
        if left <= 0:
            _log.warning(
                "run %s: attempt %s could not renew its lease in time and must stop",
                live.run_id,
                live.attempt_id,
            )
            telemetry.lease_lost(live.handler)
            return None
        return min(max(_interval(lease) / 4, MIN_RETRY_PAUSE), left)
    if lease_expires is None:
        if still_kept():  # Else its own finish ended the claim meanwhile: not a loss.
            live.mark_lease_lost()
            telemetry.lease_lost(live.handler)
            _log.warning(
                "run %s: attempt %s lost its claim or its lock; another attempt took it over",
                live.run_id,
                live.attempt_id,
            )
        return None
    telemetry.lease_renewed(live.handler, renewed=True)
    live.confirm_lease(
        lease_expires,
        local_deadline(lease_expires, asked_at, asked, lease, live.timing.monotonic()),
    )
    return _interval(lease)


def local_deadline(
    lease_expires: datetime, asked_at: datetime, asked: float, lease: timedelta, answered: float
) -> float:
    """The local monotonic time at which a lease the store just confirmed runs out.

    The store reads the clock inside its atomic change (after any wait for a lock), so
    ``lease_expires`` may lie up to that wait beyond ``asked_at + lease``; mapping it through
    the wall-clock and monotonic readings taken before the call (``asked_at``, ``asked``) keeps
    that time. It is capped at ``lease`` past the moment the answer arrived (``answered``, by
    the same monotonic clock), so a wall clock stepped during the call cannot stretch it.
    """
    granted = (lease_expires - asked_at).total_seconds()
    latest = answered + lease.total_seconds()
    return min(asked + max(granted, 0.0), latest)


def _interval(lease: timedelta) -> float:
    return lease.total_seconds() / RENEWALS_PER_LEASE
