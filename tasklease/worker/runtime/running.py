"""The handler call in progress in this context: the run a handler's own log lines belong
to, and the keys of the tasks it enqueues without naming them (Django's ``enqueue()``).

One context variable, set by the executor around each call of a handler and, for the call
of a step's function, to the step's own scope. Python copies it into ``asyncio`` tasks,
``asyncio.to_thread`` and asgiref's ``sync_to_async``, but not into a thread the handler
starts itself (https://docs.python.org/3/library/contextvars.html): an enqueue there is
outside any handler.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from tasklease.worker.core.steps import enqueue_key

__all__ = ["HandlerCall", "current_call", "handler_call", "step_call"]


@dataclass(eq=False)
class HandlerCall:
    """One call of a handler (or of a step's function inside it) for run ``run_id``.

    ``scope`` is what its derived keys are unique to: the run's delivery (a continuation is
    a new one) and the step's name inside a step. The n-th enqueue of a task on a queue in
    one scope gets the same key on every attempt of the run.
    """

    run_id: str
    handler: str
    scope: tuple[str, ...]
    _ordinals: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def next_enqueue_key(self, task: str, queue: str) -> str:
        """The key of this call's next enqueue of ``task`` on ``queue``; the count is
        shared by the threads and asyncio tasks the call's context reaches."""
        with self._lock:
            ordinal = self._ordinals.get((task, queue), 0)
            self._ordinals[(task, queue)] = ordinal + 1
        return enqueue_key(self.scope, task, queue, ordinal)

    def restart(self) -> None:
        """Count from the first enqueue again: the handler is called again in this attempt
        (the store runs its aborted transaction again), and must name the same tasks."""
        with self._lock:
            self._ordinals.clear()

    def within_step(self, name: str) -> HandlerCall:
        """The call of step ``name``'s function: its enqueues counted apart from the
        handler's, so a step replayed from its record (its function not called) moves no
        other enqueue's key."""
        return HandlerCall(self.run_id, self.handler, (*self.scope, "step", name))


_CURRENT: ContextVar[HandlerCall | None] = ContextVar("tasklease_handler_call", default=None)


def current_call() -> HandlerCall | None:
    """The handler call this code runs in, or None outside any handler."""
    return _CURRENT.get()


@contextmanager
def handler_call(run_id: str, handler: str, delivery: int = 0) -> Iterator[HandlerCall]:
    """Mark the code inside this block as ``handler``'s call for run ``run_id``'s delivery
    ``delivery`` (0: its own task, n: its n-th continuation)."""
    call = HandlerCall(run_id, handler, (run_id, str(delivery)))
    token = _CURRENT.set(call)
    try:
        yield call
    finally:
        _CURRENT.reset(token)


@contextmanager
def step_call(name: str) -> Iterator[None]:
    """Inside a handler call, give step ``name``'s function a scope of its own (fresh at
    every call of it); outside one, nothing."""
    call = _CURRENT.get()
    if call is None:
        yield
        return
    token = _CURRENT.set(call.within_step(name))
    try:
        yield
    finally:
        _CURRENT.reset(token)
