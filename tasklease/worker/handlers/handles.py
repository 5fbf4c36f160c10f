"""What ``@router.task`` and ``@router.scheduled`` return: the handler, still callable as
written, carrying its route, so that code enqueues it by reference::

    @router.task()
    async def send_receipt(payload: Order, ctx: TaskContext) -> None: ...

    send_receipt.enqueue({"order_id": 42}, key="order-42")

A misspelt handler is then a ``NameError`` at import (and for mypy), not a 404 in production,
and mypy checks the payload against the handler's annotation. Registration also refuses, at
import, a handler that cannot take the arguments the worker calls it with.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, Unpack, cast

from tasklease.errors import ConfigurationError
from tasklease.worker.core.identity import Kind
from tasklease.worker.handlers.spec import HandlerSpec

if TYPE_CHECKING:
    from tasklease.producer.async_producer import AsyncProducer
    from tasklease.producer.building import EnqueueOptions
    from tasklease.producer.producer import Producer, RunContext
    from tasklease.producer.results import EnqueueResult
    from tasklease.worker.handlers.context import TaskContext

PayloadT = TypeVar("PayloadT")
ResultT = TypeVar("ResultT")

# How the executor calls each kind of handler (positionally).
SIGNATURES = {Kind.TASK: "(payload, ctx)", Kind.SCHEDULER: "(ctx)"}
_ARITY = {Kind.TASK: 2, Kind.SCHEDULER: 1}


class Producers(Protocol):
    """What a handle asks of the router that made it: the producers that enqueue by
    reference goes through (a :class:`~tasklease.worker.handlers.router.Router`)."""

    def producer(self) -> Producer: ...

    def async_producer(self) -> AsyncProducer: ...


class _Handle:
    """The parts both kinds share: the route, and calls passed to the function."""

    # Set by functools.update_wrapper, as on any wrapper of the function.
    __name__: str
    __wrapped__: Callable[..., Any]

    def __init__(self, router: Producers, spec: HandlerSpec) -> None:
        functools.update_wrapper(cast(Any, self), spec.function)  # __name__, __doc__, ...
        self.router = router
        self.spec = spec

    @property
    def name(self) -> str:
        """The handler's name: its route is ``/tasks/<name>`` or ``/jobs/<name>``."""
        return self.spec.name

    @property
    def path(self) -> str:
        return self.spec.path

    def __repr__(self) -> str:
        return f"<{self.spec.kind.value} handler {self.spec.name!r} at {self.spec.path}>"


class TaskHandler(_Handle, Generic[PayloadT, ResultT]):
    """A task handler registered with ``@router.task``: call it as the function it wraps,
    or enqueue a task for it.

    ``enqueue``, ``enqueue_many`` and ``fan_out`` take the producer's options and go through
    ``producer=`` if given, else the router's (:meth:`Router.use_producer`, by default
    ``Producer.from_env(router=router)``). The queue is the call's ``queue=``, else the
    handler's ``@router.task(queue=...)``, else the producer's. From async code,
    ``await aenqueue(...)``, ``aenqueue_many`` and ``afan_out`` do the same through an
    :class:`~tasklease.producer.AsyncProducer` (:meth:`Router.use_async_producer`).
    """

    def __call__(self, payload: PayloadT, ctx: TaskContext) -> ResultT:
        result: ResultT = self.spec.function(payload, ctx)
        return result

    def enqueue(
        self,
        payload: PayloadT,
        key: str | None = None,
        *,
        producer: Producer | None = None,
        transaction: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> EnqueueResult:
        """Create one task for this handler: :meth:`Producer.enqueue` with its name (with
        ``transaction=``, staged in the outbox through it)."""
        return self._producer(producer).enqueue(
            self.spec.name, payload, key, transaction=transaction, **self._routed(options)
        )

    def enqueue_many(
        self,
        items: Iterable[tuple[str, PayloadT]],
        *,
        producer: Producer | None = None,
        concurrency: int = 32,
        transaction: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> list[EnqueueResult]:
        """One task per ``(key, payload)``: :meth:`Producer.enqueue_many` with its name
        (with ``transaction=``, staged in the outbox through it)."""
        return self._producer(producer).enqueue_many(
            self.spec.name,
            items,
            concurrency=concurrency,
            transaction=transaction,
            **self._routed(options),
        )

    def fan_out(
        self,
        ctx: RunContext,
        items: Iterable[tuple[str, PayloadT]],
        *,
        producer: Producer | None = None,
        concurrency: int = 32,
        transaction: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> list[EnqueueResult]:
        """From a scheduled run, one task per item keyed by the run: :meth:`Producer.fan_out`
        (with ``transaction=``, staged in the outbox through it)."""
        return self._producer(producer).fan_out(
            ctx,
            self.spec.name,
            items,
            concurrency=concurrency,
            transaction=transaction,
            **self._routed(options),
        )

    async def aenqueue(
        self,
        payload: PayloadT,
        key: str | None = None,
        *,
        producer: AsyncProducer | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> EnqueueResult:
        """:meth:`enqueue` from async code, through ``producer`` or the router's async one
        (:meth:`Router.use_async_producer`): :meth:`AsyncProducer.enqueue` with its name."""
        return await self._async_producer(producer).enqueue(
            self.spec.name, payload, key, **self._routed(options)
        )

    async def aenqueue_many(
        self,
        items: Iterable[tuple[str, PayloadT]],
        *,
        producer: AsyncProducer | None = None,
        concurrency: int = 32,
        **options: Unpack[EnqueueOptions],
    ) -> list[EnqueueResult]:
        """:meth:`enqueue_many` from async code: :meth:`AsyncProducer.enqueue_many`."""
        return await self._async_producer(producer).enqueue_many(
            self.spec.name, items, concurrency=concurrency, **self._routed(options)
        )

    async def afan_out(
        self,
        ctx: RunContext,
        items: Iterable[tuple[str, PayloadT]],
        *,
        producer: AsyncProducer | None = None,
        concurrency: int = 32,
        **options: Unpack[EnqueueOptions],
    ) -> list[EnqueueResult]:
        """:meth:`fan_out` from async code: :meth:`AsyncProducer.fan_out`."""
        return await self._async_producer(producer).fan_out(
            ctx, self.spec.name, items, concurrency=concurrency, **self._routed(options)
        )

    def _routed(self, options: EnqueueOptions) -> EnqueueOptions:
        """``options`` with the call's queue, else the handler's."""
        routed = options.copy()
        routed["queue"] = options.get("queue") or self.spec.queue
        return routed

    def _producer(self, given: Producer | None) -> Producer:
        return given if given is not None else self.router.producer()

    def _async_producer(self, given: AsyncProducer | None) -> AsyncProducer:
        return given if given is not None else self.router.async_producer()


class JobHandler(_Handle, Generic[ResultT]):
    """A scheduled handler registered with ``@router.scheduled``: call it as the function it
    wraps; Cloud Scheduler runs it at ``POST /jobs/<name>``."""

    def __call__(self, ctx: TaskContext) -> ResultT:
        result: ResultT = self.spec.function(ctx)
        return result


class TaskDecorator(Protocol):
    """``@router.task(...)``: takes ``handler(payload, ctx)``, sync or ``async def``."""

    def __call__(
        self, function: Callable[[PayloadT, TaskContext], ResultT], /
    ) -> TaskHandler[PayloadT, ResultT]: ...


class JobDecorator(Protocol):
    """``@router.scheduled(...)``: takes ``handler(ctx)``, sync or ``async def``."""

    def __call__(self, function: Callable[[TaskContext], ResultT], /) -> JobHandler[ResultT]: ...


def unwrapped(function: Callable[..., Any]) -> Callable[..., Any]:
    """The function a handle wraps (a handle registered again, e.g. on a second router),
    so that the executor calls the function itself."""
    return function.spec.function if isinstance(function, _Handle) else function


def check_signature(kind: Kind, name: str, function: Callable[..., Any]) -> None:
    """Refuse, at registration, a handler the executor could not call: it calls a task
    handler as ``handler(payload, ctx)`` and a scheduled one as ``handler(ctx)``. Extra
    parameters with defaults, and ``*args``, are fine; a callable whose signature Python
    cannot read (some built-ins) is taken on trust."""
    expected = SIGNATURES[kind]
    if not callable(function):
        raise ConfigurationError(f"{name}: a handler must be callable as handler{expected}")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*[None] * _ARITY[kind])
    except TypeError as exc:
        described = getattr(function, "__name__", type(function).__name__)
        raise ConfigurationError(
            f"{name}: a {kind.value} handler is called as handler{expected}, but "
            f"{described}{signature} cannot take that ({exc})"
        ) from None
