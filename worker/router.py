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
    """

    def __init__(self) -> None:
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
            Kind.TASK, name, lease, retention, max_attempts, allowed_service_accounts, audience
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
    ) -> Callable[[_F], _F]:
        """Register ``handler(ctx)`` at ``POST /jobs/<name>``, for a Cloud Scheduler job."""
        return self._decorator(
            Kind.SCHEDULER, name, lease, retention, max_attempts, allowed_service_accounts, audience
        )

    def handler(self, kind: Kind, name: str) -> HandlerSpec | None:
        """The handler registered for ``kind`` under ``name``, if any."""
        return self._handlers.get((kind, name))

    def __iter__(self) -> Any:
        return iter(self._handlers.values())

    def __len__(self) -> int:
        return len(self._handlers)

    def _decorator(  # noqa: PLR0917 - private; mirrors the public decorators' options.
        self,
        kind: Kind,
        name: str | None,
        lease: timedelta,
        retention: timedelta,
        max_attempts: int | None,
        allowed_service_accounts: Iterable[str] | None,
        audience: str | None,
    ) -> Callable[[_F], _F]:
        def register(function: _F) -> _F:
            spec = HandlerSpec(
                kind=kind,
                name=name or function.__name__,
                function=function,
                lease=lease,
                retention=retention,
                max_attempts=max_attempts,
                allowed_service_accounts=(
                    tuple(allowed_service_accounts)
                    if allowed_service_accounts is not None
                    else None
                ),
                audience=audience,
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
        if spec.max_attempts is not None and spec.max_attempts < 1:
            raise ConfigurationError(f"{spec.name}: max_attempts must be at least 1")
        if (spec.kind, spec.name) in self._handlers:
            raise ConfigurationError(f"{spec.kind.value} handler {spec.name!r} is registered twice")
        self._handlers[(spec.kind, spec.name)] = spec
