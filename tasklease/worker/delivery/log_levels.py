"""The level of a delivery's one log line, and what a refusal for an unknown handler adds:
what an operator must notice (a 5xx, a refusal, a dead letter, a handler name no route
has) is logged at WARNING or above, a delivery that went as planned at INFO."""

from __future__ import annotations

import logging

from tasklease.worker.core.identity import Kind
from tasklease.worker.core.outcome import Outcome
from tasklease.worker.handlers.router import Router

_NOTICED = (Outcome.UNAUTHENTICATED, Outcome.FORBIDDEN, Outcome.LOST_CLAIM, Outcome.FAILED)


def execution_level(status: int, outcome: Outcome) -> int:
    """ERROR for a 5xx; WARNING for a refused caller, a lost claim, a dead letter
    (``failed``) and a 404 (no handler of that name); INFO otherwise."""
    if status >= 500:
        return logging.ERROR
    if outcome in _NOTICED or status == 404:
        return logging.WARNING
    return logging.INFO


def known_handlers(router: Router, kind: Kind) -> str:
    """The names ``router`` serves for ``kind``, for the line of a delivery naming none of
    them (in the log only: the 404 answer goes to any caller, before authentication)."""
    names = sorted(spec.name for spec in router if spec.kind == kind)
    return ", ".join(names) if names else "(none)"
