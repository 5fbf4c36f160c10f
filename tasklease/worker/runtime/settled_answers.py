"""Answering a delivery from its stored record alone, on the ASGI server's event loop.

A retry of a task that already finished is answered from its record: no claim, no handler.
When the store never waits on I/O (:attr:`LeaseStore.nonblocking <tasklease.worker.stores.
base.LeaseStore.nonblocking>`: MemoryStore) and the authenticator never does either
(:attr:`Authenticator.nonblocking <tasklease.worker.delivery.auth.Authenticator.nonblocking>`: auth
off), that answer needs no thread: the ASGI app asks here first and hops to a delivery thread
only when the delivery needs a claim; and a delivery to an ``async def`` handler
(:func:`runs_on_loop`) is executed there whole, claim, handler and finish. Every other store
is read in a delivery thread, always.

The answer, its headers and its log line are :meth:`Executor.execute
<tasklease.worker.delivery.executor.Executor.execute>`'s own: the same code path, stopped before
the claim (:class:`ClaimNeeded`) with nothing written and nothing logged. Nothing is
remembered between deliveries: each answer reads the record, so a run an operator reopened
(``tasklease runs retry``) is never answered from what it was before.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from tasklease import protocol
from tasklease.worker.core import constants
from tasklease.worker.core.identity import Kind
from tasklease.worker.observe import telemetry

if TYPE_CHECKING:
    from tasklease.worker.delivery.executor import Delivery, Executor
    from tasklease.worker.delivery.reply import Reply
    from tasklease.worker.handlers.router import HandlerSpec

_COUNTS = (constants.TASKS_RETRY_COUNT, constants.TASKS_EXECUTION_COUNT)


class ClaimNeeded(Exception):
    """``execute(..., settled_only=True)`` reached a claim: execute the delivery off the loop."""


def answers_on_loop(executor: Executor) -> bool:
    """Whether ``executor`` may answer settled deliveries on an event loop: its store and
    authenticator never wait on I/O, and no OpenTelemetry SDK is loaded (a delivery given up
    for a claim would leave a span of its own behind)."""
    return (
        executor.store.nonblocking
        and executor.authenticator.nonblocking
        and not telemetry.opentelemetry_in_use()
    )


def runs_on_loop(spec: HandlerSpec | None) -> bool:
    """Whether a delivery to ``spec`` runs whole on the event loop, where
    :func:`answers_on_loop` holds: an ``async def`` handler's, unless it is transactional
    (its transaction holds a connection that blocks). A plain function never runs there,
    even one returning a coroutine."""
    if spec is None or spec.transactional:
        return False
    return inspect.iscoroutinefunction(spec.function)


def may_be_settled(delivery: Delivery) -> bool:
    """Whether the headers say the delivery was probably seen before (a task's retry, or a
    continuation): only then is its record read first. A hint only: a wrong one costs a
    thread hop or a read, never a wrong answer."""
    if delivery.kind is not Kind.TASK:
        return False
    header = delivery.header
    for name in _COUNTS:
        values = header(name)
        if values and values[0].strip() not in ("", "0"):
            return True
    return bool(header(protocol.CONTINUATION_HEADER))


def answer_settled(executor: Executor, delivery: Delivery) -> Reply | None:
    """The reply to ``delivery`` if its stored record (or a refusal) answers it, logged as
    ``execute`` logs it; None if it needs a claim: then ``executor.execute`` it, off the loop.
    Call it only where :func:`answers_on_loop` holds: it reads the store."""
    try:
        return executor.execute(delivery, settled_only=True)
    except ClaimNeeded:
        return None
