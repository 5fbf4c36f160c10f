"""Which run a Scheduler delivery near its slot belongs to: the slot's own, or a manual run's.

``gcloud scheduler jobs run`` sends the next slot's ScheduleTime, and its retries carry the
same headers as that slot's own delivery (docs/platform-facts.md). A delivery well before its slot
is surely manual (:func:`tasklease.worker.core.identity.parse_identity`); any other may be either,
and the manual run's record decides (:func:`tasklease.worker.core.decisions.takes_manual_delivery`).

A manual run none of whose deliveries reached the store has no record. This process remembers
the ones it answered 503, so their retries reaching it stay the manual run's; a retry reaching
another instance (or process) after the margin is taken for the slot's own delivery: the
platform sends nothing that tells them apart.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime

from tasklease.worker.core import decisions
from tasklease.worker.core.identity import DeliveryIdentity
from tasklease.worker.stores.base.store import LeaseStore

# Manual runs answered 503 before any record of them was written, per process.
MAX_UNRECORDED = 1024


class ManualRuns:
    """Resolves a delivery's identity against the store and this process's memory."""

    def __init__(self, store: LeaseStore, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.clock = clock
        self._lock = threading.Lock()
        self._unrecorded: OrderedDict[str, None] = OrderedDict()

    def resolve(self, identity: DeliveryIdentity, caller: str | None) -> DeliveryIdentity:
        """The identity the delivery runs under. Raises StoreUnavailable."""
        if not identity.maybe_manual or identity.manual:
            return identity
        manual = identity.as_manual()
        record = self.store.get(manual.run_id)
        if record is None:
            with self._lock:
                unrecorded = manual.run_id in self._unrecorded
            return manual if unrecorded else identity.as_slot()
        if decisions.takes_manual_delivery(record, self.clock(), caller):
            return manual
        return identity.as_slot()

    def answered(self, identity: DeliveryIdentity, status: int) -> None:
        """Remember a manual run answered 503 (perhaps nothing recorded), for its retries."""
        if status != 503 or not identity.manual:
            return
        with self._lock:
            self._unrecorded[identity.run_id] = None
            self._unrecorded.move_to_end(identity.run_id)
            while len(self._unrecorded) > MAX_UNRECORDED:
                self._unrecorded.popitem(last=False)
