"""Django tasks the tests enqueue; each call is recorded in CALLS (the test client runs
them in this process)."""

from __future__ import annotations

from typing import Any

from tasklease.django import compat
from tasklease.errors import PermanentFailure

CALLS: list[Any] = []


@compat.tasks.task
def record(note: str) -> str:
    CALLS.append(note)
    return f"noted {note}"


@compat.tasks.task(takes_context=True)
def with_context(context: Any, note: str) -> int:
    CALLS.append((note, context.attempt))
    attempt: int = context.attempt
    return attempt


@compat.tasks.task(queue_name="emails")
def email(to: str) -> None:
    CALLS.append(("email", to))


@compat.tasks.task
async def async_record(note: str) -> str:
    CALLS.append(("async", note))
    return note


def plain() -> None:
    """Made a task with a priority by a test: refused."""


@compat.tasks.task
def flaky(note: str) -> str:
    """Fails its first attempt: the queue's retry runs it again."""
    CALLS.append(("flaky", note))
    if len([call for call in CALLS if call == ("flaky", note)]) == 1:
        raise ConnectionError("the mail API is down")
    return note


@compat.tasks.task
def doomed(note: str) -> None:
    """Fails for good: a dead letter, never retried."""
    CALLS.append(("doomed", note))
    raise PermanentFailure(f"{note} can never succeed")
