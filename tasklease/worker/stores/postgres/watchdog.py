"""A bound on every Postgres call, even when the server stops answering altogether.

``statement_timeout`` is the server's own bound, and a server that is frozen (stopped, its
host paused, a network path that drops packets) never applies it; TCP keepalives do not help
either while the server's kernel still acknowledges. libpq has no client-side bound on a
query, so one thread per process watches the calls in flight and, past a call's deadline,
shuts its socket down: the blocked call then fails at once with a connection error (and the
pool discards the connection). ``shutdown`` wakes a thread blocked in ``poll`` on the socket,
where ``close`` from another thread would not (socket(7), shutdown(2)).

The same thread bounds a transaction the server cannot see idle (a pipeline's, which has no
Sync until its commit): past its deadline the socket is shut down and the server, reading the
end of the connection, ends the session, rolling its transaction back and freeing its locks.
The deadline runs only while no call on the connection waits for the server (a
:class:`WatchedConnection` says when one does: every send and every fetch of psycopg's goes
through ``Connection.wait``), and restarts when the last such call returns. A statement that
runs long on the server keeps its handler waiting in a fetch and is not idle; the server's
``statement_timeout`` bounds it (the handler's own, which it may raise; a server frozen
during that wait is not cut here, as no bound is known for the statement).
"""

from __future__ import annotations

import itertools
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from psycopg import Connection
from psycopg.abc import RV, PQGen

_TICK = 0.05  # How long past a deadline the watching thread may look.


class CallTimedOut(Exception):
    """The call was cut off at its deadline."""


class IdleTimedOut(Exception):
    """The transaction was idle past its bound: its connection was cut, and the server
    rolled it back."""


@dataclass
class _Call:
    # time.monotonic(); for an idle bound, math.inf until its first call returns and while
    # a call waits for the server.
    deadline: float
    connection: Any
    waiting: int = 0  # An idle bound's calls now waiting for the server.


class WatchedConnection(Connection[Any]):
    """The store's pooled psycopg connection: while :meth:`Watchdog.idle_bounded` watches it,
    each of its waits for the server (a statement sent, a result fetched, a Sync) pauses the
    idle deadline."""

    waiting: Callable[[], AbstractContextManager[None]] | None = None

    def wait(self, gen: PQGen[RV], *args: Any, **kwargs: Any) -> RV:
        """psycopg's ``Connection.wait``, inside ``waiting()`` when it is set."""
        waiting = self.waiting
        if waiting is None:
            return super().wait(gen, *args, **kwargs)
        with waiting():
            return super().wait(gen, *args, **kwargs)


class Watchdog:
    """Cuts the connections of calls past their deadline (one thread, started on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, _Call] = {}
        self._cut: set[int] = set()
        self._ids = itertools.count()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def bounded(self, connection: Any, seconds: float) -> Iterator[None]:
        """Run the block on ``connection``; past ``seconds`` its socket is shut down, and the
        block's error is replaced by :class:`CallTimedOut`."""
        key = self._register(_Call(time.monotonic() + seconds, connection))
        try:
            yield
        except Exception as exc:
            if self._finish(key):
                raise CallTimedOut(f"no answer within {seconds:g}s") from exc
            raise
        if self._finish(key):
            raise CallTimedOut(f"no answer within {seconds:g}s")

    @contextmanager
    def idle_bounded(self, connection: WatchedConnection, seconds: float) -> Iterator[None]:
        """Run the block on ``connection``; once ``seconds`` pass with no call on it waiting
        for the server, counted from the end of the last one (never before the first), the
        socket is shut down, and the block raises :class:`IdleTimedOut`, in place of what it
        raised or returned."""
        call = _Call(math.inf, connection)
        key = self._register(call)

        @contextmanager
        def waiting() -> Iterator[None]:
            with self._lock:
                call.waiting += 1
                call.deadline = math.inf
            try:
                yield
            finally:
                with self._lock:
                    call.waiting -= 1
                    if call.waiting == 0:
                        call.deadline = time.monotonic() + seconds
                self._wake.set()  # The watching thread may be waiting for no deadline at all.

        why = f"idle in its transaction for {seconds:g}s, waiting for no answer from the server"
        connection.waiting = waiting
        try:
            yield
        except Exception as exc:
            if self._finish(key):
                raise IdleTimedOut(why) from exc
            raise
        finally:
            connection.waiting = None
        if self._finish(key):
            raise IdleTimedOut(why)

    def _register(self, call: _Call) -> int:
        key = next(self._ids)
        with self._lock:
            self._calls[key] = call
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="tasklease-postgres-watchdog", daemon=True
                )
                self._thread.start()
        self._wake.set()
        return key

    def _finish(self, key: int) -> bool:
        with self._lock:
            self._calls.pop(key, None)
            if key in self._cut:
                self._cut.discard(key)
                return True
            return False

    def _watch(self) -> None:
        while True:
            self._wake.clear()  # Before looking: a call registered from now on wakes it.
            with self._lock:  # A connection is not returned to its pool while registered.
                now = time.monotonic()
                for key, call in self._calls.items():
                    if now >= call.deadline and key not in self._cut:
                        self._cut.add(key)
                        _shut_down(call.connection)
                earliest = min(
                    (call.deadline for key, call in self._calls.items() if key not in self._cut),
                    default=math.inf,
                )
            self._wake.wait(None if earliest == math.inf else earliest - now + _TICK)


def _shut_down(connection: Any) -> None:
    with suppress(Exception):
        descriptor = connection.fileno()
        sock = socket.socket(fileno=socket.dup(descriptor))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
