"""Group commit: concurrent changes from one process share one transaction and one fsync.

A durable commit costs an fsync, far more than the change itself. When several threads change
the store at once, the first becomes the *leader*: it takes everything queued so far, applies
it in one transaction and commits once, then hands the lead to the next waiting thread. At low
load a batch is one change, run by its own thread with no hand-off; under load, batches grow
to the number of threads waiting, and so does the number of changes per fsync.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

_C = TypeVar("_C")

# Changes per transaction at most: bounds how long one commit holds the write lock.
MAX_BATCH = 64


@dataclass
class Pending(Generic[_C]):
    """One change waiting for its batch: ``work`` runs inside the shared transaction."""

    work: Callable[[_C], Any]
    value: Any = None
    error: BaseException | None = None
    done: bool = False
    leads: bool = False  # This waiter was handed the lead for the next batch.
    # Set once per waiter: when its batch committed, or when it was handed the lead.
    wake: threading.Event = field(default_factory=threading.Event)


class GroupCommit(Generic[_C]):
    """Runs changes through ``commit_batch``, which must apply every change of a batch in one
    transaction and set each one's ``value`` or ``error`` (an error of the commit itself goes
    to every change of the batch)."""

    def __init__(self, commit_batch: Callable[[list[Pending[_C]]], None]) -> None:
        self._commit_batch = commit_batch
        self._lock = threading.Lock()
        self._queue: list[Pending[_C]] = []
        self._leading = False

    def run(self, work: Callable[[_C], Any]) -> Any:
        """Apply ``work`` in some batch's transaction; return its value once committed."""
        pending: Pending[_C] = Pending(work)
        with self._lock:
            self._queue.append(pending)
            if not self._leading:  # Then the queue was empty: this change leads its own batch.
                self._leading = pending.leads = True
        while not pending.done:
            if pending.leads:
                pending.leads = False
                self._lead()  # The leader is the oldest queued change: its batch holds it.
            else:
                pending.wake.wait()
                pending.wake.clear()
        if pending.error is not None:
            raise pending.error
        return pending.value

    def _lead(self) -> None:
        """Commit one batch, then hand the lead to the oldest waiter, or give it up."""
        with self._lock:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
        try:
            self._commit_batch(batch)
        except BaseException as exc:
            for pending in batch:
                if pending.error is None:
                    pending.error = exc
        finally:
            with self._lock:
                for pending in batch:
                    pending.done = True
                    pending.wake.set()
                if self._queue:
                    successor = self._queue[0]
                    successor.leads = True
                    successor.wake.set()
                else:
                    self._leading = False
