"""Group commit: concurrent changes from one process share one transaction and one fsync.

A durable commit costs an fsync, far more than the change itself. When several threads change
the store at once, the first becomes the *leader*: it takes everything queued so far, applies
it in one transaction and commits once, then hands the lead to the next waiting thread. At low
load a batch is one change, run by its own thread with no hand-off; under load, batches grow
to the number of threads waiting, and so does the number of changes per fsync.

A change that must run on its caller's own thread (a transactional handler: the user's code,
with its thread's context) takes the lead :meth:`~ChangeBatcher.alone`: no batch of the
process is in flight meanwhile, and the changes queued behind it wait for it. A change asked
for from inside that action (its thread, or code running in a copy of its context: an ``async
def`` handler on the handler loop's thread) is refused: it would wait for itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

_C = TypeVar("_C")
_T = TypeVar("_T")

# Changes per transaction at most: bounds how long one commit holds the write lock.
MAX_BATCH = 64

# The ChangeBatcher whose ``alone`` action this context runs in, if any. A context variable, not
# the thread: the handler loop runs an async handler's coroutine in a copy of the request
# thread's context but on its own thread.
_RUNNING_ALONE: ContextVar[ChangeBatcher[Any] | None] = ContextVar(
    "tasklease_group_commit_alone", default=None
)


@dataclass
class Pending(Generic[_C]):
    """One change waiting for its batch: ``work`` runs inside the shared transaction."""

    work: Callable[[_C], Any]
    value: Any = None
    error: BaseException | None = None
    done: bool = False
    leads: bool = False  # This waiter was handed the lead for the next batch.
    solo: bool = False  # Runs alone, on its own thread (see ChangeBatcher.alone).
    # Set once per waiter: when its batch committed, or when it was handed the lead.
    wake: threading.Event = field(default_factory=threading.Event)


class ChangeBatcher(Generic[_C]):
    """Group commit of changes (the SQLite store's, the emulator's): runs them through
    ``commit_batch``, which must apply every change of a batch in one transaction and set each
    one's ``value`` or ``error`` (an error of the commit itself goes to every change of the
    batch)."""

    def __init__(self, commit_batch: Callable[[list[Pending[_C]]], None]) -> None:
        self._commit_batch = commit_batch
        self._lock = threading.Lock()
        self._queue: list[Pending[_C]] = []
        self._leading = False
        self._alone: threading.Thread | None = None  # The thread running alone, if any.

    def run(self, work: Callable[[_C], Any]) -> Any:
        """Apply ``work`` in some batch's transaction; return its value once committed."""
        if self._inside_alone():
            raise RuntimeError(
                "a change of the store from inside its own transaction would wait for itself"
            )
        pending: Pending[_C] = Pending(work)
        self._enqueue(pending)
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

    def alone(self, action: Callable[[], _T]) -> _T:
        """Run ``action`` on this thread while no batch of this process is in flight: it
        makes its own transaction. Changes queued meanwhile wait for it, then batch again."""
        if self._inside_alone():
            raise RuntimeError("a transaction of the store inside its own transaction")
        pending: Pending[_C] = Pending(lambda _: None, solo=True)
        self._enqueue(pending)
        while not pending.leads:
            pending.wake.wait()
            pending.wake.clear()
        with self._lock:  # The leader is the oldest queued change: this one.
            self._queue.remove(pending)
            self._alone = threading.current_thread()
        token = _RUNNING_ALONE.set(self)
        try:
            return action()
        finally:
            _RUNNING_ALONE.reset(token)
            with self._lock:
                self._alone = None
                self._hand_off()

    def _inside_alone(self) -> bool:
        """Whether the caller runs inside this instance's ``alone`` action."""
        return self._alone is threading.current_thread() or _RUNNING_ALONE.get() is self

    def _enqueue(self, pending: Pending[_C]) -> None:
        with self._lock:
            self._queue.append(pending)
            if not self._leading:  # Then the queue was empty: this change leads its own batch.
                self._leading = pending.leads = True

    def _lead(self) -> None:
        """Commit one batch, then hand the lead to the oldest waiter, or give it up."""
        with self._lock:
            size = next(
                (at for at, queued in enumerate(self._queue[:MAX_BATCH]) if queued.solo),
                min(len(self._queue), MAX_BATCH),
            )
            batch, self._queue = self._queue[:size], self._queue[size:]
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
                self._hand_off()

    def _hand_off(self) -> None:
        """Hand the lead to the oldest waiter, or give it up (under ``_lock``)."""
        if self._queue:
            successor = self._queue[0]
            successor.leads = True
            successor.wake.set()
        else:
            self._leading = False
