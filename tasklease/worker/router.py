"""Handlers registered in code, by name, for Cloud Tasks and Cloud Scheduler routes."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from tasklease import protocol
from tasklease.errors import ConfigurationError
from tasklease.worker.core import constants as c
from tasklease.worker.core.identity import Kind

if TYPE_CHECKING:
    from tasklease.worker.targets import ProxyTarget

_F = TypeVar("_F", bound=Callable[..., Any])
_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}", re.ASCII)

OnOverlap = Literal["skip", "retry"]
ConcurrencyKey = Callable[[Any], Any]


@dataclass(frozen=True)
class HandlerSpec:
    """One registered handler and its options."""

    kind: Kind
    name: str
    function: Callable[..., Any]
    lease: timedelta = c.DEFAULT_LEASE
    retention: timedelta = c.DEFAULT_RETENTION
    max_attempts: int | None = None
    allowed_service_accounts: tuple[str, ...] | None = None
    audience: str | None = None
    manual_run_margin: timedelta = c.DEFAULT_MANUAL_RUN_MARGIN
    exclusive: bool = False
    max_runtime: timedelta | None = None
    min_gap: timedelta = timedelta(0)
    on_overlap: OnOverlap = "skip"
    concurrency_key: ConcurrencyKey | None = None

    @property
    def path(self) -> str:
        """The URL path Cloud Tasks or Cloud Scheduler must POST to."""
        prefix = (
            protocol.TASK_ROUTE_PREFIX
            if self.kind is Kind.TASK
            else protocol.SCHEDULER_ROUTE_PREFIX
        )
        return prefix + self.name


class Router:
    """Collects handlers; :func:`tasklease.worker.create_app` serves them.

    Options of both decorators:

    - ``lease``: how long one attempt holds the run before another may take it over. The
      worker renews it about every ``lease / 3`` while the handler runs, so it bounds how long a
      crashed attempt blocks retries, not how long a handler may run.
    - ``retention``: how long the run record is kept after the claim; it must outlive the
      queue's retry window (Cloud Tasks remembers task names for up to 24 hours).
    - ``max_attempts``: after this many claims of one run, the run is recorded as failed
      without running again (a poison-message guard independent of the queue's settings).
    - ``allowed_service_accounts`` / ``audience``: override the app-wide OIDC settings.

    Option of scheduled handlers (and of the router, as their default):

    - ``manual_run_margin`` (default 60 s, at least ``MAX_CLOCK_SKEW``): a delivery whose
      schedule time lies more than this after its arrival is a manual run (``gcloud scheduler
      jobs run`` or the Console's "Force run" send the *next* slot's time, well before it). It
      runs as a run of its own, derived from that slot, so its retries stay one run, whenever
      they arrive (the store's record of it tells them from the slot's own delivery), and the
      slot's own delivery still runs when it comes. Keep it well below the job's interval: for
      a job firing every minute, a manual run started within the margin before the next slot
      counts as that slot's run.

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

    Option of task handlers:

    - ``concurrency_key=lambda payload: payload["account_id"]``: at most one task per key
      runs at a time, across instances. A task whose key is busy is answered 409 (outcome
      ``key_busy``) with Retry-After, without consuming an attempt; Cloud Tasks retries it.
    """

    def __init__(self, *, manual_run_margin: timedelta = c.DEFAULT_MANUAL_RUN_MARGIN) -> None:
        _check_margin("router", manual_run_margin)
        self.manual_run_margin = manual_run_margin
        self._handlers: dict[tuple[Kind, str], HandlerSpec] = {}

    def task(
        self,
        name: str | None = None,
        *,
        lease: timedelta = c.DEFAULT_LEASE,
        retention: timedelta = c.DEFAULT_RETENTION,
        max_attempts: int | None = None,
        allowed_service_accounts: Iterable[str] | None = None,
        audience: str | None = None,
        concurrency_key: ConcurrencyKey | None = None,
    ) -> Callable[[_F], _F]:
        """Register ``handler(payload, ctx)`` at ``POST /tasks/<name>`` (default: its name)."""
        return self._decorator(
            Kind.TASK,
            name,
            lease=lease,
            retention=retention,
            max_attempts=max_attempts,
            allowed_service_accounts=allowed_service_accounts,
            audience=audience,
            concurrency_key=concurrency_key,
        )

    def scheduled(
        self,
        name: str | None = None,
        *,
        lease: timedelta = c.DEFAULT_LEASE,
        retention: timedelta = c.DEFAULT_RETENTION,
        max_attempts: int | None = None,
        allowed_service_accounts: Iterable[str] | None = None,
        audience: str | None = None,
        manual_run_margin: timedelta | None = None,
        exclusive: bool = False,
        max_runtime: timedelta | None = None,
        min_gap: timedelta = timedelta(0),
        on_overlap: OnOverlap = "skip",
    ) -> Callable[[_F], _F]:
        """Register ``handler(ctx)`` at ``POST /jobs/<name>``, for a Cloud Scheduler job."""
        return self._decorator(
            Kind.SCHEDULER,
            name,
            lease=lease,
            retention=retention,
            max_attempts=max_attempts,
            allowed_service_accounts=allowed_service_accounts,
            audience=audience,
            manual_run_margin=(
                self.manual_run_margin if manual_run_margin is None else manual_run_margin
            ),
            exclusive=exclusive,
            max_runtime=max_runtime,
            min_gap=min_gap,
            on_overlap=on_overlap,
        )

    def proxy_job(
        self,
        name: str,
        *,
        target: ProxyTarget[Any],
        lease: timedelta = c.DEFAULT_LEASE,
        retention: timedelta = c.DEFAULT_RETENTION,
        max_attempts: int | None = None,
        allowed_service_accounts: Iterable[str] | None = None,
        audience: str | None = None,
        manual_run_margin: timedelta | None = None,
    ) -> ProxyTarget[Any]:
        """Serve a built-in target from :mod:`tasklease.worker.targets` at ``POST /jobs/<name>``.

        Point the Cloud Scheduler job at the worker instead of at ``*.googleapis.com``: each
        run claims like any scheduled handler, then starts the execution at most once (see
        the target's documentation for what a retry adopts). The stored result names the
        execution, and duplicates are answered with it. Options as for :meth:`scheduled`.
        """
        self.scheduled(
            name,
            lease=lease,
            retention=retention,
            max_attempts=max_attempts,
            allowed_service_accounts=allowed_service_accounts,
            audience=audience,
            manual_run_margin=manual_run_margin,
        )(target)
        return target

    def handler(self, kind: Kind, name: str) -> HandlerSpec | None:
        """The handler registered for ``kind`` under ``name``, if any."""
        return self._handlers.get((kind, name))

    def __iter__(self) -> Any:
        return iter(self._handlers.values())

    def __len__(self) -> int:
        return len(self._handlers)

    def _decorator(
        self,
        kind: Kind,
        name: str | None,
        *,
        allowed_service_accounts: Iterable[str] | None,
        **options: Any,
    ) -> Callable[[_F], _F]:
        def register(function: _F) -> _F:
            spec = HandlerSpec(
                kind=kind,
                name=name or function.__name__,
                function=function,
                allowed_service_accounts=(
                    tuple(allowed_service_accounts)
                    if allowed_service_accounts is not None
                    else None
                ),
                **options,
            )
            self._add(spec)
            return function

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
    if spec.concurrency_key is not None and not callable(spec.concurrency_key):
        raise ConfigurationError(f"{spec.name}: concurrency_key must be a function of the payload")
