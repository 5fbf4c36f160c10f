"""The handlers: ``TASKLEASE_ROUTER=myapp.tasks:router`` (set by ``tasklease deploy``)."""

from __future__ import annotations

import functools
from typing import Any

from myapp import mail
from tasklease import PermanentFailure, Producer, Router, TaskContext

router = Router()


@functools.cache
def producer() -> Producer:
    """Configured by the TASKLEASE_* variables the deploy sets; tests put a stub queue's."""
    return Producer.from_env()


def sign_up(email: str) -> None:
    """Called by the web app: one welcome mail per address, however often this runs."""
    producer().enqueue("send_welcome", {"email": email}, key=f"welcome/{email}")


@router.task("send_welcome")
def send_welcome(payload: dict[str, Any], ctx: TaskContext) -> None:
    email = payload.get("email", "")
    if "@" not in email:
        raise PermanentFailure(f"not an email address: {email!r}")  # Recorded; no retry.
    mail.send(email, "Welcome!", idempotency_key=ctx.idempotency_key)


@router.scheduled("weekly_digest")
def weekly_digest(ctx: TaskContext) -> None:
    """Fan out one digest per subscriber; a re-delivered run creates no task twice."""
    producer().fan_out(
        ctx, "send_digest", [(email, {"email": email}) for email in mail.SUBSCRIBERS]
    )


@router.task("send_digest")
def send_digest(payload: dict[str, Any], ctx: TaskContext) -> None:
    mail.send(payload["email"], "Your weekly digest", idempotency_key=ctx.idempotency_key)
