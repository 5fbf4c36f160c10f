"""A stand-in mailer: a real one would pass ``idempotency_key`` to its provider."""

from __future__ import annotations

SUBSCRIBERS = ["ann@example.com", "bob@example.com"]

outbox: list[tuple[str, str]] = []


def send(to: str, subject: str, *, idempotency_key: str) -> None:
    outbox.append((to, subject))
