"""Claims whose write may have landed unseen, and their give-back (the Firestore, Postgres and
Spanner stores').

A claim whose ``create()`` or ``update()`` failed in a way that may have committed, and that
could not be read back, is answered :class:`StoreUnavailable` without running the handler.
If its write did land, the run would stay held by an attempt that never runs until its lease
expires. Each such claim is noted here and given back soon: before the next claim of its run
in this process, or by a background retry with a doubling delay.

Safe because attempt ids are single use: the delivery whose claim failed never runs the
handler, and no later claim carries its attempt id; the give-back is conditional on that
attempt still holding the run.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime

from tasklease.errors import StoreUnavailable
from tasklease.worker.core import decisions
from tasklease.worker.core.records import RunRecord

# Background retries: first delay, then doubling up to the maximum.
ORPHAN_RETRY_FIRST = 0.5
ORPHAN_RETRY_MAX = 60.0
MAX_ORPHANS = 10_000
ORPHAN_ERROR = "the claim's write landed but its call failed; released, the handler never ran"

log = logging.getLogger("tasklease.store.firestore")

GiveBack = Callable[[str, str, datetime], RunRecord | None]
"""Gives back run ``run_id``'s claim by ``attempt_id`` as of the claim's time, only while that
attempt holds it; returns the record written (None: no longer held). Raises StoreUnavailable."""


def orphan_released(record: RunRecord, now: datetime) -> RunRecord:
    """The record of an orphan claim given back: released, its attempt not counted (the
    handler never ran, so ``max_attempts`` must not count it)."""
    return decisions.yielded(record, ORPHAN_ERROR, now)


class OrphanClaims:
    """The claims of one process that may have landed unseen, released by ``give_back``."""

    def __init__(self, give_back: GiveBack, logger: logging.Logger = log) -> None:
        self._give_back = give_back
        self._log = logger
        self._lock = threading.Lock()
        # (run id, attempt id) -> the claim's time.
        self._orphans: OrderedDict[tuple[str, str], datetime] = OrderedDict()
        self._timer: threading.Timer | None = None
        self._delay = ORPHAN_RETRY_FIRST

    def note(self, claimed: RunRecord) -> None:
        """Remember a claim that may have landed unseen, and release it soon."""
        with self._lock:
            self._orphans[(claimed.run_id, claimed.attempt_id)] = claimed.claimed_at
            while len(self._orphans) > MAX_ORPHANS:
                self._orphans.popitem(last=False)  # Its lease expires by itself.
        self._schedule()

    def release(self, only_run: str | None = None) -> None:
        """Give back the noted claims (all, or ``only_run``'s), each only while its attempt
        still holds it, as of the claim's own time (nothing ran): the next delivery runs at
        once. Claims the store cannot reach now are kept for the next call or the timer."""
        if not self._orphans:
            return
        with self._lock:
            pending = [
                (key, claimed_at)
                for key, claimed_at in self._orphans.items()
                if only_run is None or key[0] == only_run
            ]
        for (run_id, attempt_id), claimed_at in pending:
            try:
                released = self._give_back(run_id, attempt_id, claimed_at)
            except StoreUnavailable:
                continue
            with self._lock:
                self._orphans.pop((run_id, attempt_id), None)
            if released is not None:
                self._log.info(
                    "released run %s: attempt %s's claim landed unseen", run_id, attempt_id
                )
        with self._lock:
            if not self._orphans:
                self._delay = ORPHAN_RETRY_FIRST
        self._schedule()

    def forget_all(self) -> None:
        """Drop every note (a forked child: the parent process still owns them)."""
        # Not under the lock: a fork copies it as it was, and one another thread of the
        # parent held at that moment would stay held in the child for ever. The child runs
        # only the forking thread, so fresh state is taken without asking.
        self._lock = threading.Lock()
        self._orphans = OrderedDict()
        self._timer = None
        self._delay = ORPHAN_RETRY_FIRST

    def close(self) -> None:
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _schedule(self) -> None:
        with self._lock:
            if self._timer is not None or not self._orphans:
                return
            timer = threading.Timer(self._delay, self._release_in_background)
            timer.daemon = True
            self._timer = timer
            self._delay = min(self._delay * 2, ORPHAN_RETRY_MAX)
        timer.start()

    def _release_in_background(self) -> None:
        with self._lock:
            self._timer = None
        try:
            self.release()
        except Exception:  # A background thread has no caller to tell; it must not die noisily.
            self._log.exception("could not release claims that may have landed unseen")
