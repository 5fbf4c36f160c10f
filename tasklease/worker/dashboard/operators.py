"""Who may use the dashboard mounted in a worker: operators named for it, never by default
the accounts that deliver tasks, whose tokens pass through queues, logs and proxies."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tasklease import protocol
from tasklease.errors import ConfigurationError
from tasklease.worker.auth.authenticators import (
    Authenticator,
    AuthRequest,
    AuthResult,
    NoAuth,
    OidcAuth,
    expected_audiences,
)
from tasklease.worker.core.identity import Kind
from tasklease.worker.handlers.router import HandlerSpec

_log = logging.getLogger("tasklease.dashboard")

DASHBOARD_HANDLER = "tasklease-dashboard"


@dataclass(frozen=True)
class OperatorAuth:
    """Checks ``Authorization: Bearer <OIDC ID token>`` with the worker's own authenticator,
    for one of ``operators`` (required), with the audience ``audience`` when given, else the
    worker's. With authentication off (``auth="none"``, local development) the page is open,
    unless operators are named: then it refuses to start.
    """

    authenticator: Authenticator
    operators: tuple[str, ...] | None = None
    audience: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.authenticator, NoAuth):
            if self.operators:
                raise ConfigurationError(
                    "dashboard operators need OIDC authentication to be checked: "
                    "auth='none' would let anyone in"
                )
            _log.warning("the dashboard is mounted with authentication OFF: anyone may use it")
        elif not self.operators:
            raise ConfigurationError(
                "the mounted dashboard needs its operators named: set "
                f"{protocol.ENV_DASHBOARD_OPERATORS} "
                "(or create_app(..., dashboard_operators=[...])) "
                "to the accounts allowed to release and replay runs. The accounts that "
                "deliver tasks are not let in by default: their tokens travel with every task."
            )

    @property
    def spec(self) -> HandlerSpec:
        """The dashboard as a handler: only its allow-list and audience are used."""
        return HandlerSpec(
            Kind.TASK,
            DASHBOARD_HANDLER,
            _no_handler,
            allowed_service_accounts=self.operators,
            audience=self.audience,
        )

    def check(self, authorization: str | None, url: str) -> AuthResult:
        return self.authenticator.authenticate(AuthRequest(authorization, url), self.spec)

    def check_apart_from(self, deliveries: Iterable[HandlerSpec]) -> None:
        """Refuse to start when a token a delivery carries would open the dashboard: an
        operator that also delivers, with an audience some delivery's token carries."""
        auth = self.authenticator
        if not isinstance(auth, OidcAuth) or not self.operators:
            return
        delivering = set(auth.allowed_service_accounts)
        audiences = set(expected_audiences(auth.audience, "/")) if auth.audience else set()
        for spec in deliveries:
            delivering |= set(spec.allowed_service_accounts or ())
            if configured := spec.audience or auth.audience:
                audiences |= set(expected_audiences(configured, spec.path))
        shared = sorted(set(self.operators) & delivering)
        configured = self.audience or auth.audience
        mine = set(expected_audiences(configured, self.spec.path)) if configured else set()
        if shared and mine & audiences:
            raise ConfigurationError(
                f"dashboard operator {shared[0]} also delivers tasks: a token captured from a "
                "delivery would open the dashboard. Name a separate operator account in "
                f"{protocol.ENV_DASHBOARD_OPERATORS}, or set "
                f"{protocol.ENV_DASHBOARD_AUDIENCE} to an audience "
                "no delivery uses (and mint the operators' tokens for it)."
            )


def _no_handler(*_: Any) -> None:
    """The dashboard's stand-in handler: only its allow-list and audience are used."""
