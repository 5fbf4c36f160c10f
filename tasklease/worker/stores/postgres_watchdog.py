"""A bound on every Postgres call, even when the server stops answering altogether.

``statement_timeout`` is the server's own bound, and a server that is frozen (stopped, its
host paused, a network path that drops packets) never applies it; TCP keepalives do not help
either while the server's kernel still acknowledges. libpq has no client-side bound on a
query, so one thread per process watches the calls in flight and, past a call's deadline,
shuts its socket down: the blocked call then fails at once with a connection error (and the
pool discards the connection). ``shutdown`` wakes a thread blocked in ``poll`` on the socket,
where ``close`` from another thread would not (socket(7), shutdown(2)).
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

_TICK = 0.05  # How often the watching thread looks, while any call is in flight.


class CallTimedOut(Exception):
    """The call was cut off at its deadline."""


class Watchdog:
    """Cuts the connections of calls past their deadline (one thread, started on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[float, Any]] = {}
        self._cut: set[int] = set()
        self._ids = itertools.count()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def bounded(self, connection: Any, seconds: float) -> Iterator[None]:
        """Run the block on ``connection``; past ``seconds`` its socket is shut down, and the
        block's error is replaced by :class:`CallTimedOut`."""
        key = next(self._ids)
        with self._lock:
            self._calls[key] = (time.monotonic() + seconds, connection)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="tasklease-postgres-watchdog", daemon=True
                )
                self._thread.start()
        self._wake.set()
        try:
            yield
        except Exception as exc:
            if self._finish(key):
                raise CallTimedOut(f"no answer within {seconds:g}s") from exc
            raise
        if self._finish(key):
            raise CallTimedOut(f"no answer within {seconds:g}s")

    def _finish(self, key: int) -> bool:
        with self._lock:
            self._calls.pop(key, None)
            if key in self._cut:
                self._cut.discard(key)
                return True
            return False

    def _watch(self) -> None:
        while True:
            if not self._calls:
                self._wake.wait()
                self._wake.clear()
            time.sleep(_TICK)
            now = time.monotonic()
            with self._lock:  # A connection is not returned to its pool while registered.
                for key, (deadline, connection) in list(self._calls.items()):
                    if now >= deadline and key not in self._cut:
                        self._cut.add(key)
                        _shut_down(connection)


def _shut_down(connection: Any) -> None:
    with suppress(Exception):
        descriptor = connection.fileno()
        sock = socket.socket(fileno=socket.dup(descriptor))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
