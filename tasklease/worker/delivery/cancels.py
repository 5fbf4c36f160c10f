"""Cancellation on the delivery side: a run found cancelled is answered 200 and never runs,
a fan-out child of a cancelled parent ends cancelled before it runs, and a run whose holder
died after it was marked is ended ``cancelled`` by the next delivery that finds it.

The rules are in :mod:`tasklease.worker.core.cancellation`; the attempt that sees the mark
while it runs ends its own run (:meth:`~tasklease.worker.delivery.endings.Finisher.cancel`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from tasklease.errors import StoreUnavailable
from tasklease.worker.core import cancellation
from tasklease.worker.core.identity import DeliveryIdentity
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.delivery.endings import store_unavailable
from tasklease.worker.delivery.reply import Reply
from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["Cancels"]


class Cancels:
    """What the executor asks about cancellations before it runs a handler."""

    def __init__(self, store: LeaseStore, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.clock = clock

    def cancelled_parent(self, identity: DeliveryIdentity) -> str | None:
        """The id of this delivery's parent run (a fan-out's child) when that run is
        cancelled, else None: one read, for children only. Raises StoreUnavailable."""
        parent = identity.parent
        if parent is None or parent == identity.run_id:
            return None
        return parent if cancellation.is_cancelled(self.store.get(parent)) else None

    def settle(self, record: RunRecord) -> Reply | None:
        """Write the end of a run marked cancelled whose holder is gone (its record still
        in progress or released), so that listings and its children see it ``cancelled``;
        None once written (or nothing to write), else the 503 that has the queue retry."""
        if record.status is RunStatus.CANCELLED:
            return None
        by = record.cancelled_by or "an operator"
        try:
            self.store.cancel_run(record.run_id, by, self.clock)
        except StoreUnavailable as exc:
            return store_unavailable(
                f"the run is cancelled; its end could not be recorded: {exc}", record.run_id
            )
        return None
