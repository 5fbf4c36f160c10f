"""A value made lazily, once per process.

Threads, connections and file descriptors do not carry across a fork (gunicorn forks its
workers after the app is imported): a value made in the parent must be made anew in each
child, and a child must never use, or close, the parent's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

_T = TypeVar("_T")
# This process's id, kept anew at each fork: ``os.getpid`` is a system call per use.
_process = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _process.__setitem__(0, os.getpid()))


class PerProcess(Generic[_T]):
    """``make()``'s value, made on first use in each process (once, under a lock)."""

    def __init__(self, make: Callable[[], _T]) -> None:
        self._make = make
        self._made: tuple[int, _T] | None = None  # (pid, value)
        self._lock = threading.Lock()

    def get(self) -> _T:
        made = self._made
        if made is None or made[0] != _process[0]:
            with self._lock:
                made = self._made
                if made is None or made[0] != _process[0]:
                    made = self._made = (_process[0], self._make())
        return made[1]

    def made_here(self) -> _T | None:
        """The value if this process made it (to close it), else None."""
        made = self._made
        return made[1] if made is not None and made[0] == _process[0] else None

    def forget(self) -> None:
        """Make the value anew on next use."""
        self._made = None
