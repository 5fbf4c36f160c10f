"""Many HTTP exchanges at once from one thread: non-blocking sockets and a selector.

The dispatcher used to give each attempt a thread that sent it and blocked for the answer. In
Python every such attempt cost a hand-off to a pool thread, a sleep and a wake-up around the
answer, and a fight for the interpreter lock with the threads serving the API: in the
throughput benchmark, about as much CPU as the attempt's own work. Here the dispatcher's own
thread sends every attempt and reads every answer as it arrives.

Only plain ``http://`` to an address that needs no DNS look-up (an IP literal or
``localhost``) goes this way: a slow resolver or a TLS handshake would stall every other
attempt. The dispatcher sends anything else with the blocking
:class:`~tasklease.emulator.sender.Sender`, as before. Requests are the same bytes the
blocking sender puts on the wire (:func:`tasklease.emulator.http_wire.encode_request`), and
connections are kept alive the same way.

A request on a kept-alive connection that the target closed before answering a byte (it
timed the connection out as the request went out: a race no check before sending can close)
is sent again on a new connection, within the same attempt and deadline, once. Browsers do
the same for any method (Chromium's ``HttpNetworkTransaction::ShouldResendRequest``); a
target that closes every connection unanswered still gets a failed attempt, on the new one.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import http.client
import ipaddress
import os
import selectors
import socket
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from urllib3.util import Url

from tasklease.emulator.http_wire import ResponseReader, encode_request
from tasklease.emulator.sender import OUTCOME_HEADER, AttemptResult, bounded_text, retry_after

Origin = tuple[str, int]  # host, port
_READ_BYTES = 65536
# New connections being opened to one origin at a time: a burst of attempts waits for these
# (or for a connection to come free) instead of flooding the target's accept queue, which
# drops connections past its backlog (5 for Python's socketserver).
_CONNECTING_PER_ORIGIN = 4


def direct_origin(url: Url) -> Origin | None:
    """``url``'s host and port when it can be sent from the selector thread: plain HTTP to an
    IP literal or ``localhost``; None otherwise."""
    if url.scheme not in (None, "http") or not url.host:
        return None
    host = url.host.strip("[]")
    if host.lower() != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return None
    return host, url.port or 80


@dataclass(eq=False)
class _Exchange:
    key: Hashable
    origin: Origin
    request: bytes
    head: bool
    deadline: float
    started_us: int
    fault: str | None
    sock: socket.socket | None = None
    reused: bool = False
    connecting: bool = False  # Counted in its origin's connections being opened.
    connected: bool = False
    addresses: list[Any] = field(default_factory=list)  # Left to try, as getaddrinfo gave them.
    sent: int = 0
    answered: bool = False  # Some byte of an answer arrived.
    reader: ResponseReader = field(init=False)

    def __post_init__(self) -> None:
        self.reader = ResponseReader(head=self.head)

    def __lt__(self, other: _Exchange) -> bool:  # Ties in the deadline heap.
        return id(self) < id(other)


class Exchanges:
    """Sends requests and collects their answers; :meth:`poll` drives everything.

    Not thread-safe, except :meth:`interrupt`: one thread starts exchanges and polls.
    """

    def __init__(self, per_origin: int = 128) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._idle: dict[Origin, list[socket.socket]] = {}
        self._connecting: dict[Origin, int] = {}
        self._waiting: dict[Origin, deque[_Exchange]] = {}  # For a connection, in order.
        self._per_origin = per_origin
        self._deadlines: list[tuple[float, _Exchange]] = []
        self._finished: list[tuple[Hashable, AttemptResult]] = []
        self._open = 0  # Exchanges started and not finished.

    @property
    def active(self) -> int:
        return self._open

    def start(
        self,
        key: Hashable,
        origin: Origin,
        *,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes,
        timeout: float,
        fault: str | None = None,
    ) -> None:
        """Send a request; its result comes back from :meth:`poll` with ``key``. Raises what
        http.client raises for a request it will not send (a bad header, say)."""
        host, port = origin
        request = encode_request(
            host, port, method=method, target=target, headers=headers, body=body
        )
        exchange = _Exchange(
            key, origin, request, method == "HEAD", time.monotonic() + timeout, _now_us(), fault
        )
        self._open += 1
        heapq.heappush(self._deadlines, (exchange.deadline, exchange))
        idle = self._idle.get(origin)
        if idle:
            sock = idle.pop()
            self._selector.unregister(sock)
            self._use(exchange, sock)
        elif self._connecting.get(origin, 0) < _CONNECTING_PER_ORIGIN:
            self._connect(exchange)
        else:
            self._waiting.setdefault(origin, deque()).append(exchange)

    def interrupt(self) -> None:
        """Make a :meth:`poll` in progress return now (from any thread)."""
        with contextlib.suppress(OSError):  # Full (already interrupted) or closed.
            self._wake_write.send(b"\0")

    def poll(self, timeout: float) -> list[tuple[Hashable, AttemptResult]]:
        """Wait up to ``timeout`` seconds for sockets to be ready (or an interrupt), advance
        every exchange that can, and return those that ended."""
        if self._deadlines:
            timeout = min(timeout, max(0.0, self._deadlines[0][0] - time.monotonic()))
        for selected, _ in self._selector.select(max(0.0, timeout)):
            data = selected.data
            if data is None:
                self._drain_wakeups()
            elif isinstance(data, _Exchange):
                self._advance(data)
            else:  # An idle connection that became readable: the target closed it.
                self._drop_idle(selected.fileobj, data)  # type: ignore[arg-type]
        self._expire(time.monotonic())
        finished, self._finished = self._finished, []
        return finished

    def next_deadline(self) -> float | None:
        return self._deadlines[0][0] if self._deadlines else None

    def close(self) -> None:
        for key in list(self._selector.get_map().values()):
            if key.fileobj not in (self._wake_read,):
                key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()
        self._wake_read.close()
        self._wake_write.close()
        self._idle.clear()

    def _use(self, exchange: _Exchange, sock: socket.socket) -> None:
        """Send ``exchange`` on a kept-alive connection."""
        exchange.sock, exchange.reused, exchange.connected = sock, True, True
        self._send(exchange)

    def _next_waiting(self, origin: Origin) -> _Exchange | None:
        waiting = self._waiting.get(origin)
        while waiting:
            exchange = waiting.popleft()
            if exchange.deadline >= 0:  # Not ended (by its deadline) while it waited.
                return exchange
        return None

    def _connected(self, exchange: _Exchange) -> None:
        """``exchange``'s connection attempt ended (either way): let a waiting exchange
        open another."""
        if not exchange.connecting:
            return
        exchange.connecting = False
        self._connecting[exchange.origin] -= 1
        if (waiting := self._next_waiting(exchange.origin)) is not None:
            self._connect(waiting)

    def _connect(self, exchange: _Exchange) -> None:
        host, port = exchange.origin
        self._connecting[exchange.origin] = self._connecting.get(exchange.origin, 0) + 1
        exchange.connecting = True
        try:
            exchange.addresses = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        except OSError as exc:
            self._fail(exchange, exc)
            return
        self._try_next_address(exchange, None)

    def _try_next_address(self, exchange: _Exchange, error: OSError | None) -> None:
        """Connect to the next address ``localhost`` resolved to, as
        socket.create_connection does; fail with the last error when none is left."""
        while exchange.addresses:
            family, kind, proto, _, address = exchange.addresses.pop(0)
            try:
                sock = socket.socket(family, kind, proto)
            except OSError as exc:
                error = exc
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            code = sock.connect_ex(address)
            if code in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
                exchange.sock = sock
                self._selector.register(sock, selectors.EVENT_WRITE, exchange)
                return
            if code == 0:
                exchange.sock, exchange.connected = sock, True
                self._connected(exchange)
                self._send(exchange)
                return
            sock.close()
            error = OSError(code, os.strerror(code))
        self._fail(exchange, error or OSError(errno.EHOSTUNREACH, "no address to connect to"))

    def _advance(self, exchange: _Exchange) -> None:
        sock = exchange.sock
        if sock is None:
            return
        if not exchange.connected:
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                self._selector.unregister(sock)
                sock.close()
                exchange.sock = None
                self._try_next_address(exchange, OSError(code, os.strerror(code)))
            else:
                exchange.connected = True
                self._connected(exchange)
                self._send(exchange)
        elif exchange.sent < len(exchange.request):
            self._send(exchange)
        else:
            self._receive(exchange)

    def _send(self, exchange: _Exchange) -> None:
        assert exchange.sock is not None
        try:
            exchange.sent += exchange.sock.send(exchange.request[exchange.sent :])
        except BlockingIOError:
            pass
        except OSError as exc:
            if not self._resend(exchange):
                self._fail(exchange, exc)
            return
        events = selectors.EVENT_WRITE
        if exchange.sent >= len(exchange.request):
            events = selectors.EVENT_READ
        try:
            self._selector.modify(exchange.sock, events, exchange)
        except KeyError:
            self._selector.register(exchange.sock, events, exchange)

    def _receive(self, exchange: _Exchange) -> None:
        assert exchange.sock is not None
        try:
            data = exchange.sock.recv(_READ_BYTES)
        except BlockingIOError:
            return
        except OSError as exc:
            if not self._resend(exchange):
                self._fail(exchange, exc)
            return
        if not data and self._resend(exchange):
            return
        exchange.answered = exchange.answered or bool(data)
        reader = exchange.reader
        try:
            if data:
                reader.feed(data)
            else:
                reader.eof()
        except (http.client.HTTPException, ValueError) as exc:
            self._fail(exchange, exc)
            return
        if reader.done:
            self._succeed(exchange, keep=bool(data) and not reader.will_close)

    def _succeed(self, exchange: _Exchange, *, keep: bool) -> None:
        reader = exchange.reader
        result = AttemptResult(
            reader.status,
            bounded_text(reader.header(OUTCOME_HEADER)),
            None,
            retry_after(reader.header("Retry-After")),
            exchange.started_us,
            _now_us(),
            exchange.fault,
            bounded_text(reader.header("Location")),
        )
        sock, exchange.sock = exchange.sock, None
        assert sock is not None
        self._selector.unregister(sock)
        self._end(exchange, result)
        if not keep:
            sock.close()
        elif (waiting := self._next_waiting(exchange.origin)) is not None:
            self._use(waiting, sock)
        elif len(idle := self._idle.setdefault(exchange.origin, [])) < self._per_origin:
            idle.append(sock)
            self._selector.register(sock, selectors.EVENT_READ, exchange.origin)
        else:
            sock.close()

    def _resend(self, exchange: _Exchange) -> bool:
        """Send ``exchange`` again on a new connection if the kept-alive one it went out on
        was closed before any of the answer came; False if it was not (it must fail)."""
        if not exchange.reused or exchange.answered:
            return False
        sock, exchange.sock = exchange.sock, None
        if sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            sock.close()
        exchange.reused, exchange.connected, exchange.sent = False, False, 0
        exchange.reader = ResponseReader(head=exchange.head)
        if self._connecting.get(exchange.origin, 0) < _CONNECTING_PER_ORIGIN:
            self._connect(exchange)
        else:
            self._waiting.setdefault(exchange.origin, deque()).appendleft(exchange)
        return True

    def _fail(self, exchange: _Exchange, error: BaseException, message: str | None = None) -> None:
        sock, exchange.sock = exchange.sock, None
        if sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            sock.close()
        self._connected(exchange)  # If it was still connecting (its deadline passed).
        text = message or f"{type(error).__name__}: {error}"[:300]
        self._end(
            exchange,
            AttemptResult(None, None, text, None, exchange.started_us, _now_us(), exchange.fault),
        )

    def _end(self, exchange: _Exchange, result: AttemptResult) -> None:
        self._open -= 1
        exchange.deadline = -1.0  # Ended: its heap entry is skipped.
        self._finished.append((exchange.key, result))

    def _expire(self, now: float) -> None:
        while self._deadlines and (
            self._deadlines[0][1].deadline < 0 or self._deadlines[0][0] <= now
        ):
            _, exchange = heapq.heappop(self._deadlines)
            if exchange.deadline >= 0:
                self._fail(exchange, TimeoutError(), "no answer within the deadline")

    def _drop_idle(self, sock: socket.socket, origin: Origin) -> None:
        idle = self._idle.get(origin, [])
        if sock not in idle:  # Not idle any more: this event is about a closed socket.
            return
        idle.remove(sock)
        self._selector.unregister(sock)
        sock.close()

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass


def _now_us() -> int:
    return time.time_ns() // 1000
