"""Cancelling a run: ``tasklease.cancel``, ``tasklease runs cancel`` and the dashboard's
button, one operation.

A run nothing runs is cancelled at once; a running one is marked, and its attempt ends it at
its next step or lease renewal; its fan-out children that have not run never do. The rules
are in :mod:`tasklease.worker.core.cancellation`, the delivery side in
:mod:`tasklease.worker.delivery.cancels`.
"""

from __future__ import annotations

import getpass
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from tasklease.errors import ConfigurationError
from tasklease.protocol import rfc3339_or_none
from tasklease.worker.core.cancellation import CancelOutcome
from tasklease.worker.core.records import RunRecord
from tasklease.worker.runtime.clock import utc_now
from tasklease.worker.stores.base.store import LeaseStore

if TYPE_CHECKING:
    from tasklease.producer import Producer

__all__ = ["MAX_BY_CHARS", "CancelResult", "cancel", "cancel_run", "default_by"]

MAX_BY_CHARS = 200  # Who cancelled, as the record keeps it.

_log = logging.getLogger("tasklease.operations")
_log.addHandler(logging.NullHandler())  # A library's logger: the application configures output.


@dataclass(frozen=True)
class CancelResult:
    """What cancelling ``run_id`` found, and its record afterwards (None: no such run)."""

    run_id: str
    outcome: CancelOutcome
    record: RunRecord | None

    @property
    def accepted(self) -> bool:
        """Whether the run is (or will be, at its next step or renewal) cancelled."""
        return self.outcome.accepted

    @property
    def summary(self) -> str:
        """What the cancellation did, in one sentence, for the command line and the dashboard."""
        record = self.record
        by = record.cancelled_by if record is not None else None
        at = rfc3339_or_none(record.cancelled_at) if record is not None else None
        return {
            CancelOutcome.CANCELLED: f"cancelled by {by} at {at}: it never runs again",
            CancelOutcome.STOPPING: f"marked cancelled by {by} at {at}: its running attempt "
            "stops at its next step or lease renewal",
            CancelOutcome.ALREADY: f"already cancelled by {by} at {at}",
            CancelOutcome.ENDED: "not cancelled: it has ended ("
            + (record.status.value if record is not None else "?")
            + ")",
            CancelOutcome.MISSING: "no such run (or past its retention): nothing to cancel",
        }[self.outcome]


def default_by() -> str:
    """Who cancels when the caller does not say: the OS user, else ``"an operator"``."""
    try:
        return getpass.getuser() or "an operator"
    except (KeyError, OSError):  # No user name in the environment nor the password file.
        return "an operator"


def _checked_by(by: str | None) -> str:
    if by is None:
        return default_by()
    if not isinstance(by, str) or not by.strip():
        raise ConfigurationError(
            "cancel(by=...): name who cancels (a person or a service), a non-empty string"
        )
    if len(by) > MAX_BY_CHARS:
        raise ConfigurationError(
            f"cancel(by=...): {len(by)} characters, over {MAX_BY_CHARS}: give a shorter name"
        )
    return by.strip()


def cancel_run(
    store: LeaseStore,
    run_id: str,
    by: str | None = None,
    *,
    clock: Callable[[], datetime] = utc_now,
) -> CancelResult:
    """Cancel the run ``run_id`` (its whole id) for ``by`` (default: :func:`default_by`):
    one atomic change of its record (:meth:`LeaseStore.cancel_run`). Logged as an operator
    action when it cancelled or marked the run."""
    if not isinstance(run_id, str) or not run_id:
        raise ConfigurationError("cancel: give the run id (`tasklease runs list` shows them)")
    who = _checked_by(by)
    decision = store.cancel_run(run_id, who, clock)
    if decision.outcome in (CancelOutcome.CANCELLED, CancelOutcome.STOPPING):
        _log.info("%s cancelled run %s (%s)", who, run_id, decision.outcome.value)
    return CancelResult(run_id, decision.outcome, decision.record)


def cancel(
    run_id: str,
    *,
    store: LeaseStore,
    producer: Producer | None = None,
    by: str | None = None,
) -> bool:
    """Cancel the run ``run_id``: True when it is cancelled (or already was), or marked
    while an attempt runs it (that attempt sees it at its next ``ctx.step`` or lease
    renewal, which raises :class:`~tasklease.errors.Cancelled`, and the run ends
    ``cancelled`` without a retry); False when there is nothing to cancel: the run has
    ended (completed, failed, skipped), or the store has no such run (an unknown id, or one
    past its retention: the two cannot be told apart).

    A waiting run, one released for a retry and one between continuations never run again:
    each of their deliveries is answered 200. The run's fan-out children that have not run
    never do (they end ``cancelled``), and a join it fanned out enqueues no ``then``.
    ``by`` (default: the OS user) is kept on the record with the time. ``producer`` is
    accepted so that ``cancel`` takes what ``signal`` takes; a cancellation enqueues nothing.
    Raises :class:`~tasklease.errors.StoreUnavailable` when the store fails (nothing was
    changed), :class:`~tasklease.errors.ConfigurationError` for an empty ``run_id`` or ``by``.
    """
    del producer  # Nothing to enqueue: every later delivery ends at the record.
    return cancel_run(store, run_id, by).accepted
