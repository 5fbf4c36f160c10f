"""The async producer a router's handles enqueue through with ``await handle.aenqueue(...)``:
the one given to :meth:`Router.use_async_producer`, else one
``AsyncProducer.from_env(router=router)`` per event loop (its gRPC channel belongs to the
loop that made it, so a producer is never shared across loops)."""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import TYPE_CHECKING

from tasklease.errors import ConfigurationError

if TYPE_CHECKING:
    from tasklease.producer.async_producer import AsyncProducer
    from tasklease.producer.building import TaskRoutes


def no_producer(exc: ValueError, use: str) -> ConfigurationError:
    """The error of enqueue by reference when the environment configures no producer."""
    return ConfigurationError(
        f"enqueue by reference needs a producer: {exc}, or give the router one "
        f"with router.{use}(producer) (in tests: tasklease_queue.bind(router))"
    )


class AsyncProducers:
    """A router's async producer: the given one, else one per running loop."""

    def __init__(self, router: TaskRoutes) -> None:
        self._router = router
        self._given: AsyncProducer | None = None
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncProducer] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def use(self, producer: AsyncProducer | None) -> AsyncProducer | None:
        """Enqueue through ``producer`` from now on (None: the default); the previous one."""
        with self._lock:
            previous, self._given = self._given, producer
        return previous

    def get(self) -> AsyncProducer:
        """The producer for the running loop (call it from a coroutine)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._given is not None:
                return self._given
            producer = self._per_loop.get(loop)
            if producer is None:
                from tasklease.producer.async_producer import AsyncProducer  # noqa: PLC0415

                try:
                    producer = AsyncProducer.from_env(router=self._router)
                except ValueError as exc:
                    raise no_producer(exc, "use_async_producer") from exc
                self._per_loop[loop] = producer
            return producer
