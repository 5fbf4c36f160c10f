"""In-process wake-ups for following relays: a SQLAlchemy ``Session``'s ``after_commit``
nudges every relay of the process, so it relays now rather than at its next poll."""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_waiters: set[threading.Event] = set()


def waiter() -> threading.Event:
    """An event :func:`nudge` sets; :func:`forget` it when done."""
    event = threading.Event()
    with _lock:
        _waiters.add(event)
    return event


def forget(event: threading.Event) -> None:
    with _lock:
        _waiters.discard(event)


def nudge(*_: Any) -> None:
    """Wake every waiting relay of this process (an event hook: any arguments)."""
    with _lock:
        for event in _waiters:
            event.set()
