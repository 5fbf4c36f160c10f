"""Handlers registered in code, by name, for Cloud Tasks and Cloud Scheduler routes."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from worker import constants as c
from worker.errors import ConfigurationError
from worker.identity import Kind

_F = TypeVar("_F", bound=Callable[..., Any])
_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}", re.ASCII)


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

    @property
    def path(self) -> str:
        """The URL path Cloud Tasks or Cloud Scheduler must POST to."""
        prefix = c.TASK_ROUTE_PREFIX if self.kind is Kind.TASK else c.SCHEDULER_ROUTE_PREFIX
        return prefix + self.name


class Router:
    """Collects handlers; :func:`worker.create_app` serves them.

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

    - ``manual_run_margin`` (default 60 s): a delivery whose schedule time lies more than this
      after its arrival is a manual run (``gcloud scheduler jobs run`` or the Console's "Force
      run" send the *next* slot's time, well before it). It runs as a run of its own, derived
      from that slot, so its retries stay one run and the slot's own delivery still runs
      when it comes. Keep it well below the job's interval: for a job firing every minute, a
      manual run cannot be told apart from an early delivery of the next slot, and counts as
      that slot's run.
    """

    def __init__(self, *, manual_run_margin: timedelta = c.DEFAULT_MANUAL_RUN_MARGIN) -> None:
        if manual_run_margin < timedelta(0):
            raise ConfigurationError("manual_run_margin must not be negative")
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
        )

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
        if spec.manual_run_margin < timedelta(0):
            raise ConfigurationError(f"{spec.name}: manual_run_margin must not be negative")
        if spec.max_attempts is not None and spec.max_attempts < 1:
            raise ConfigurationError(f"{spec.name}: max_attempts must be at least 1")
        if (spec.kind, spec.name) in self._handlers:
            raise ConfigurationError(f"{spec.kind.value} handler {spec.name!r} is registered twice")
        self._handlers[(spec.kind, spec.name)] = spec
