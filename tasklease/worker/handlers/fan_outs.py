"""Fan-out and fan-in from inside a handler: ``ctx.fan_out``, ``ctx.afan_out`` and, in a
join's ``then`` handler, ``ctx.fan_in_results``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from tasklease.errors import ConfigurationError, FanInGone
from tasklease.worker.core import fan_in as rules
from tasklease.worker.core.fan_in import JOIN_KEEP_FLOOR
from tasklease.worker.stores.base.fan_ins import FanInStore

if TYPE_CHECKING:
    from tasklease.producer.producer import Producer
    from tasklease.producer.results import EnqueueResult
    from tasklease.worker.handlers.steps import StepRunner


class ProducerSource(Protocol):
    """Where ``ctx.fan_out`` gets its producer: a :class:`~tasklease.worker.Router` fits."""

    def producer(self) -> Producer: ...


class FanOuts:
    """The fan-out methods of :class:`~tasklease.worker.handlers.context.TaskContext`."""

    run_id: str
    fan_in_of: str | None
    _steps: StepRunner
    _producers: ProducerSource | None

    def fan_out(
        self,
        task_name: str,
        items: Iterable[tuple[str, Any]],
        *,
        then: str | None = None,
        producer: Producer | None = None,
        **options: Any,
    ) -> list[EnqueueResult]:
        """One task ``task_name`` per ``(key, payload)`` item, named from this run (so a
        retried delivery creates no second set), through ``producer`` or the router's
        (:meth:`Router.use_producer`): :meth:`Producer.fan_out`.

        With ``then="handler"``, a join: once every child has finished (completed, or failed
        for good) the task handler ``then`` runs once, its payload listing each child's key,
        status and result (``payload["results"]``; past 1,000 children, the first page, and
        :meth:`fan_in_results` for the rest). Each child counts in the same store write as
        its own completion record, so duplicates never count twice and a lost answer never
        loses a count. Keys must be unique, and the items the same in every attempt
        (compute them in a step)."""
        store = self._steps.store
        if then is not None and store is not None and not isinstance(store, FanInStore):
            raise ConfigurationError(
                f"ctx.fan_out(..., then={then!r}): the worker's store {store!r} keeps no joins, "
                "so the children could never count: use a store that does (every store "
                "tasklease ships)"
            )
        source = producer if producer is not None else self._router_producer()
        return source.fan_out(self, task_name, items, then=then, **options)

    async def afan_out(
        self,
        task_name: str,
        items: Iterable[tuple[str, Any]],
        *,
        then: str | None = None,
        producer: Producer | None = None,
        **options: Any,
    ) -> list[EnqueueResult]:
        """:meth:`fan_out` from an ``async def`` handler: the creates run off its loop."""
        listed = list(items)
        return await asyncio.to_thread(
            lambda: self.fan_out(task_name, listed, then=then, producer=producer, **options)
        )

    def fan_in_results(
        self, after: str | None = None, limit: int = rules.MAX_INLINE_RESULTS
    ) -> list[dict[str, Any]]:
        """In a join's ``then`` handler: up to ``limit`` children's results (key, status,
        result, error) with keys after ``after``, by key. Page from
        ``payload["next_after"]`` when the payload could not hold them all."""
        if self.fan_in_of is None:
            raise RuntimeError(
                "ctx.fan_in_results: this delivery is not a fan-in's then task "
                "(fan_out(..., then=...) enqueues those)"
            )
        store = self._steps.store
        if not isinstance(store, FanInStore):
            raise RuntimeError("ctx.fan_in_results: the worker's store keeps no joins")
        if store.fan_in_progress(self.fan_in_of) is None:
            raise FanInGone(
                f"ctx.fan_in_results: the join {self.fan_in_of} is no longer in the store (kept "
                f"{JOIN_KEEP_FLOOR.days} days past its last count, or its children's retention "
                "if longer): its results cannot be paged"
            )
        entries = store.fan_in_entries(self.fan_in_of, after or None, limit)
        return [entry.as_result() for entry in entries]

    def _router_producer(self) -> Producer:
        if self._producers is None:
            raise ConfigurationError(
                "ctx.fan_out: this context has no router to enqueue through "
                "(a TaskContext made by hand): pass producer="
            )
        return self._producers.producer()
