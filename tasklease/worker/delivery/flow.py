"""What a delivery waits for, yielded by :meth:`Executor.steps
<tasklease.worker.delivery.executor.Executor.steps>` to the code that drives it.

The delivery protocol is written once, as a generator: it yields an :class:`Await` for an
``async def`` handler's coroutine and a :class:`Blocking` call for work that waits on I/O
outside the store (a continuation's enqueue), and is sent back each one's result (or thrown
its exception) at the point it yielded, inside the same ``with`` blocks (lease renewal, log
fields). :func:`run_in_thread` drives it in a request thread (gunicorn, an ASGI delivery
thread): it awaits a coroutine on tasklease's handler loop
(:mod:`tasklease.worker.runtime.event_loop`) and calls a blocking function in place;
:meth:`Executor.execute` is this. A test may drive the steps one by one instead.

:func:`handler_run` is the handler's call and its awaits, the same steps for the plain path
and for the transactional one (whose store calls it inside its transaction, driven there by
:func:`run_in_thread`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from tasklease.worker.core.identity import Kind
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import HandlerSpec
from tasklease.worker.runtime.event_loop import HANDLER_LOOP

T = TypeVar("T")


class Await:
    """Await ``awaitable`` (a handler's coroutine) and send back its result."""

    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self.awaitable = awaitable


class Blocking:
    """Call ``function()``, which may wait on I/O, never on an event loop."""

    __slots__ = ("function",)

    def __init__(self, function: Callable[[], Any]) -> None:
        self.function = function


Step = Await | Blocking
Steps = Generator[Step, Any, T]


def run_in_thread(steps: Steps[T]) -> T:
    """Drive ``steps`` in the calling thread, blocking it while a coroutine runs on the
    handler loop."""
    try:
        step = next(steps)
        while True:
            try:
                if isinstance(step, Await):
                    value = HANDLER_LOOP.run(step.awaitable)
                else:
                    value = step.function()
            except BaseException as exc:  # Raised where the step was yielded.
                step = steps.throw(exc)
            else:
                step = steps.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result


def handler_run(spec: HandlerSpec, payload: Any, ctx: TaskContext) -> Steps[Any]:
    """Call ``spec``'s handler (a task's with its payload) and await what it returns while
    that is awaitable (``async def``, or a function returning a coroutine): its result."""
    result = spec.function(payload, ctx) if spec.kind is Kind.TASK else spec.function(ctx)
    while inspect.isawaitable(result):
        result = yield Await(result)
    return result
