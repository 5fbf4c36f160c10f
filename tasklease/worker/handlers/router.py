"""Handlers registered in code, by name, for Cloud Tasks and Cloud Scheduler routes."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, get_args

from tasklease.errors import ConfigurationError
from tasklease.plumbing.keywords import refuse_unknown_options
from tasklease.worker.core import constants as c
from tasklease.worker.core.identity import Kind
from tasklease.worker.handlers.async_producers import AsyncProducers, no_producer
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.declared_jobs import check_schedule
from tasklease.worker.handlers.handles import (
    JobDecorator,
    JobHandler,
    TaskDecorator,
    TaskHandler,
    check_signature,
    unwrapped,
)
from tasklease.worker.handlers.options import HandlerOptions, JobOptions
from tasklease.worker.handlers.spec import ConcurrencyKey, HandlerSpec, JobRetry, OnOverlap

if TYPE_CHECKING:
    from tasklease.producer.async_producer import AsyncProducer
    from tasklease.producer.producer import Producer

# HandlerSpec is defined below the router (tasklease.worker.handlers.spec), and read from
# here as it always was: the router records one per handler.
__all__ = ["HandlerSpec", "Router"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}", re.ASCII)

# What proxy_job serves: a built-in target of tasklease.worker.targets, or any callable of
# the context alone (the targets import the handlers' context, so not the other way round).
_Target = TypeVar("_Target", bound=Callable[[TaskContext], dict[str, Any]])


class Router:
    """Collects handlers; :func:`tasklease.worker.create_app` serves them.

    Options of every handler kind (``lease``, ``retention``, ``max_attempts``,
    ``allowed_service_accounts``, ``audience``) are :class:`~tasklease.worker.HandlerOptions`;
    scheduled handlers' add ``manual_run_margin`` (:class:`~tasklease.worker.JobOptions`; the
    router's own is their default).

    Options of scheduled handlers, for jobs whose runs must not overlap (a nightly job still
    running when the next tick fires, two timers firing one job, a manual run meanwhile):

    - ``exclusive=True``: at most one run of the handler executes at a time, across every
      instance and process. The job lock is held under the run's own renewing lease, so a
      live run never loses it however long it runs.
    - ``max_runtime``: the safety expiry for a holder that stopped renewing (ShedLock's
      lockAtMostFor): until then its lapsed lease still keeps other runs out, in case it is
      still working unheard. A run still renewing past it keeps the lock. Default: the lease
      alone decides.
    - ``min_gap`` (ShedLock's lockAtLeastFor): a run starting less than this after the last
      run *started* counts as an overlap; it absorbs clock drift between timers.
    - ``on_overlap``: ``"skip"`` (default) answers 200 and records the run as skipped, naming
      the run that held the job; ``"retry"`` answers 409 with Retry-After, so Cloud Scheduler
      retries it within the job's retry config (its retry_count defaults to 0: set it).

    Options of task handlers:

    - ``concurrency_key=lambda payload: payload["account_id"]``: at most one task per key
      runs at a time, across instances. A task whose key is busy is answered 409 (outcome
      ``key_busy``) with Retry-After, without consuming an attempt; Cloud Tasks retries it.
    - ``queue``: the queue ``handler.enqueue(...)`` creates its tasks in, unless the call
      names one (default: the producer's). On a scheduled handler: the queue its runs'
      continuations (``ctx.continue_later``) go to (default: the producer's).

    Options of scheduled handlers, for their Cloud Scheduler job, declared in code (checked
    here: a bad one is a ConfigurationError naming the handler, at import):

    - ``schedule``: unix-cron of five fields (``"0 3 * * *"``); ``time_zone``: a tz database
      name (default ``Etc/UTC``); ``retry``: a :class:`JobRetry` (default: Cloud Scheduler's,
      no retry); ``description``; ``attempt_deadline`` (15 s to 30 min, default 3 min).
      ``tasklease deploy``, ``tasklease dev``, the ``tasklease_scheduler`` fixture (after
      ``bind(router)``) and ``tasklease runs stuck`` read the job from the router. A
      ``[[job]]`` table of the same name in tasklease.toml (or the dev jobs file) overrides
      the fields it sets (:func:`tasklease.jobs.parse_jobs`); a table naming a handler with no
      schedule in code is that handler's job, as before.
    Option of both:

    - ``transactional=True``: the handler runs inside the store's own database transaction,
      given to it as ``ctx.transaction``, and the run's completion record is written in that
      transaction, only while this attempt holds the claim: its writes through
      ``ctx.transaction`` are kept exactly when the run completes. Needs a
      :class:`~tasklease.worker.stores.base.transactional.TransactionalStore` (``create_app``
      refuses it on one without).

    Handlers may be ``async def``: the worker awaits them (see :mod:`.event_loop`). Each
    decorator returns a handle (:class:`~tasklease.worker.handlers.handles.TaskHandler`,
    :class:`~tasklease.worker.handlers.handles.JobHandler`) that calls the function as written and
    carries its route: ``send_receipt.enqueue(payload, key=...)`` goes through the producer
    given to :meth:`use_producer`, by default ``Producer.from_env(router=router)``;
    ``await send_receipt.aenqueue(...)`` through :meth:`use_async_producer`'s.
    """

    def __init__(self, *, manual_run_margin: timedelta = c.DEFAULT_MANUAL_RUN_MARGIN) -> None:
        _check_margin("router", manual_run_margin)
        self.manual_run_margin = manual_run_margin
        self._handlers: dict[tuple[Kind, str], HandlerSpec] = {}
        self._producer: Producer | None = None
        self._producer_lock = threading.Lock()
        self._async_producers = AsyncProducers(self)

    def task(
        self,
        name: str | None = None,
        *,
        concurrency_key: ConcurrencyKey | None = None,
        queue: str | None = None,
        transactional: bool = False,
        **options: Unpack[HandlerOptions],
    ) -> TaskDecorator:
        """Register ``handler(payload, ctx)`` at ``POST /tasks/<name>`` (default: its name).
        ``options``: :class:`~tasklease.worker.HandlerOptions`."""
        refuse_unknown_options(self.task, options, HandlerOptions.__optional_keys__)
        register = self._decorator(
            Kind.TASK,
            name,
            options,
            concurrency_key=concurrency_key,
            queue=queue,
            transactional=transactional,
        )

        def task_handle(function: Callable[..., Any], /) -> TaskHandler[Any, Any]:
            return TaskHandler(self, register(function))

        return task_handle

    def scheduled(
        self,
        name: str | None = None,
        *,
        exclusive: bool = False,
        max_runtime: timedelta | None = None,
        min_gap: timedelta = timedelta(0),
        on_overlap: OnOverlap = "skip",
        schedule: str | None = None,
        time_zone: str | None = None,
        retry: JobRetry | None = None,
        description: str = "",
        attempt_deadline: timedelta | None = None,
        transactional: bool = False,
        queue: str | None = None,
        **options: Unpack[JobOptions],
    ) -> JobDecorator:
        """Register ``handler(ctx)`` at ``POST /jobs/<name>``, for a Cloud Scheduler job (the
        one ``schedule=`` declares, if given). ``options``:
        :class:`~tasklease.worker.JobOptions`."""
        refuse_unknown_options(self.scheduled, options, JobOptions.__optional_keys__)
        margin = options.get("manual_run_margin")
        register = self._decorator(
            Kind.SCHEDULER,
            name,
            options,
            manual_run_margin=self.manual_run_margin if margin is None else margin,
            exclusive=exclusive,
            max_runtime=max_runtime,
            min_gap=min_gap,
            on_overlap=on_overlap,
            schedule=schedule,
            time_zone=time_zone,
            retry=retry,
            description=description,
            attempt_deadline=attempt_deadline,
            transactional=transactional,
            queue=queue,
        )

        def job_handle(function: Callable[..., Any], /) -> JobHandler[Any]:
            return JobHandler(self, register(function))

        return job_handle

    def proxy_job(self, name: str, *, target: _Target, **options: Unpack[JobOptions]) -> _Target:
        """Serve a built-in target from :mod:`tasklease.worker.targets` at ``POST /jobs/<name>``.

        Point the Cloud Scheduler job at the worker instead of at ``*.googleapis.com``: each
        run claims like any scheduled handler, then starts the execution at most once (see
        the target's documentation for what a retry adopts). The stored result names the
        execution, and duplicates are answered with it. ``options``:
        :class:`~tasklease.worker.JobOptions`, as for :meth:`scheduled`.
        """
        refuse_unknown_options(self.proxy_job, options, JobOptions.__optional_keys__)
        self.scheduled(name, **options)(target)
        return target

    def add_outbox_sweep(self, name: str, sweep: Callable[[], dict[str, int]]) -> None:
        """Serve the outbox's ``sweep`` (what :func:`tasklease.outbox.register` hands over) as
        the scheduled job ``name``: exclusive, a run that finds one still going skipped."""

        @self.scheduled(name, exclusive=True, on_overlap="skip")
        def tasklease_outbox_sweep(ctx: Any) -> dict[str, int]:
            return sweep()

    def handler(self, kind: Kind, name: str) -> HandlerSpec | None:
        """The handler registered for ``kind`` under ``name``, if any."""
        return self._handlers.get((kind, name))

    def has_task(self, name: str) -> bool:
        """Whether a task handler is registered under ``name`` (what a producer given this
        router checks every task name against)."""
        return (Kind.TASK, name) in self._handlers

    def use_producer(self, producer: Producer | None) -> Producer | None:
        """Enqueue by reference through ``producer`` from now on (None: the default again).
        Returns the producer used until now, to restore it (None: the default)."""
        with self._producer_lock:
            previous, self._producer = self._producer, producer
        return previous

    def producer(self) -> Producer:
        """The producer enqueue by reference goes through: the one given to
        :meth:`use_producer`, else ``Producer.from_env(router=self)``, made on first use."""
        with self._producer_lock:
            if self._producer is None:
                from tasklease.producer.producer import Producer  # noqa: PLC0415 - on use only.

                try:
                    self._producer = Producer.from_env(router=self)
                except ValueError as exc:
                    raise no_producer(exc, "use_producer") from exc
            return self._producer

    def use_async_producer(self, producer: AsyncProducer | None) -> AsyncProducer | None:
        """``await handle.aenqueue(...)`` goes through ``producer`` from now on (None: the
        default again); returns the one used until now. The default is
        ``AsyncProducer.from_env(router=self)``, one per event loop."""
        return self._async_producers.use(producer)

    def async_producer(self) -> AsyncProducer:
        """The async producer of the running loop that ``aenqueue`` goes through."""
        return self._async_producers.get()

    def __iter__(self) -> Iterator[HandlerSpec]:
        return iter(self._handlers.values())

    def __len__(self) -> int:
        return len(self._handlers)

    def _decorator(
        self, kind: Kind, name: str | None, common: HandlerOptions, **specific: Any
    ) -> Callable[[Callable[..., Any]], HandlerSpec]:
        """Register with ``common`` options and the kind's ``specific`` ones, which win (a
        default resolved by the kind, such as the manual-run margin); HandlerSpec's defaults
        fill in the rest."""
        fields: dict[str, Any] = {**common, **specific}
        accounts = common.get("allowed_service_accounts")
        if accounts is not None:
            fields["allowed_service_accounts"] = tuple(accounts)

        def register(function: Callable[..., Any]) -> HandlerSpec:
            function = unwrapped(function)
            handler_name = name or str(getattr(function, "__name__", ""))
            check_signature(kind, handler_name, function)
            spec = HandlerSpec(kind=kind, name=handler_name, function=function, **fields)
            self._add(spec)
            return spec

        return register

    def _add(self, spec: HandlerSpec) -> None:
        if not _NAME.fullmatch(spec.name):
            raise ConfigurationError(
                f"handler name {spec.name!r}: use 1-100 letters, digits, '-' or '_'"
            )
        if spec.lease < c.MIN_LEASE:
            raise ConfigurationError(f"{spec.name}: lease must be at least {c.MIN_LEASE}")
        if spec.retention <= spec.lease:
            raise ConfigurationError(f"{spec.name}: retention must be longer than the lease")
        _check_margin(spec.name, spec.manual_run_margin)
        if spec.max_attempts is not None and spec.max_attempts < 1:
            raise ConfigurationError(f"{spec.name}: max_attempts must be at least 1")
        _check_exclusion(spec)
        check_schedule(spec)
        if spec.queue is not None and not _NAME.fullmatch(spec.queue):
            raise ConfigurationError(f"{spec.name}: queue {spec.queue!r} is not a queue ID")
        if (spec.kind, spec.name) in self._handlers:
            raise ConfigurationError(f"{spec.kind.value} handler {spec.name!r} is registered twice")
        self._handlers[(spec.kind, spec.name)] = spec


def _check_margin(owner: str, margin: timedelta) -> None:
    """A margin below the clock-skew bound would read the slot's own delivery, seen early by a
    clock running behind, as a manual run: its retry would then run the slot again."""
    if margin < c.MAX_CLOCK_SKEW:
        raise ConfigurationError(
            f"{owner}: manual_run_margin must be at least MAX_CLOCK_SKEW ({c.MAX_CLOCK_SKEW})"
        )


def _check_exclusion(spec: HandlerSpec) -> None:
    """Refuse exclusion options that would silently do nothing, or something else."""
    if spec.on_overlap not in get_args(OnOverlap):
        raise ConfigurationError(f"{spec.name}: on_overlap must be 'skip' or 'retry'")
    if not spec.exclusive and (
        spec.max_runtime is not None or spec.min_gap or spec.on_overlap != "skip"
    ):
        raise ConfigurationError(
            f"{spec.name}: max_runtime, min_gap and on_overlap apply only with exclusive=True"
        )
    if spec.max_runtime is not None and spec.max_runtime <= timedelta(0):
        raise ConfigurationError(f"{spec.name}: max_runtime must be positive")
    if spec.min_gap < timedelta(0):
        raise ConfigurationError(f"{spec.name}: min_gap must not be negative")
    if spec.transactional and (spec.exclusive or spec.concurrency_key is not None):
        # The lock's fenced release would have to be checked inside the store's transaction.
        raise ConfigurationError(
            f"{spec.name}: transactional=True does not combine with exclusive=True or a "
            "concurrency_key yet"
        )
    if spec.concurrency_key is not None and not callable(spec.concurrency_key):
        raise ConfigurationError(f"{spec.name}: concurrency_key must be a function of the payload")
