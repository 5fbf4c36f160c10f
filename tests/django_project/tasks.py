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


@compat.tasks.task
def ledger_entry(note: str) -> None:
    """Writes a row of the app's database, then fails its first attempt (after the write)."""
    from django.db import connection  # noqa: PLC0415 - the app's database, once configured.

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO ledger (note) VALUES (%s)", [note])
    CALLS.append(("ledger", note))
    if CALLS.count(("ledger", note)) == 1:
        raise ConnectionError("the receipt API is down")
