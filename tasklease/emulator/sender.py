"""Sending one attempt to a target over HTTP, with fault injection."""

from __future__ import annotations

import http.client
import math
import threading
import time
from dataclasses import dataclass

from urllib3.util import parse_url

from tasklease.emulator.connections import Connections, Origin
from tasklease.emulator.faults import Faults
from tasklease.emulator.headers import without_framing
from tasklease.emulator.redirects import next_hop

OUTCOME_HEADER = "X-Tasklease-Outcome"  # Recorded when the target is a tasklease worker.
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Every value read from a target is bounded before it is stored or computed with. A Retry-After
# delays a retry by at most the 31 days a task may live (docs/platform-facts.md), far inside
# SQLite's 64-bit integers once in microseconds.
MAX_RETRY_AFTER_SECONDS = 31 * 86_400.0
MAX_RECORDED_TEXT = 200
# An answer's body is read to keep its connection alive, up to this much; a longer one closes it.
MAX_DRAINED_BYTES = 1024 * 1024
_READ_BYTES = 65536


@dataclass(frozen=True)
class AttemptResult:
    """What came back from one request. ``status`` None: no answer before the deadline, a
    connection error, or an answer the fault injector dropped."""

    status: int | None
    outcome: str | None
    error: str | None
    retry_after: float | None
    started_us: int
    finished_us: int
    fault: str | None = None
    location: str | None = None  # A redirect's Location, bounded.

    @property
    def succeeded(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def duration_ms(self) -> float:
        return (self.finished_us - self.started_us) / 1000


class Sender:
    """Sends attempts over kept-alive connections shared by the dispatch threads."""

    def __init__(self, faults: Faults, pool_size: int = 128) -> None:
        self.faults = faults
        self._connections = Connections(per_origin=pool_size)

    def close(self) -> None:
        self._connections.clear()

    def send(
        self, method: str, url: str, headers: dict[str, str], body: bytes, timeout: float
    ) -> tuple[AttemptResult, AttemptResult | None]:
        """One attempt; returns its result and, if a duplicate was injected, the duplicate's."""
        duplicate: list[AttemptResult] = []
        twin = None
        if self.faults.roll(self.faults.duplicate):
            twin = threading.Thread(
                target=lambda: duplicate.append(
                    self._send_once(method, url, headers, body, timeout, fault="duplicate")
                ),
                daemon=True,
            )
            twin.start()
        result = self._send_once(method, url, headers, body, timeout, fault=None)
        if twin is not None:
            twin.join()
        return self.lose_response(result), (duplicate[0] if duplicate else None)

    def follow(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes,
        timeout: float,
        *,
        fault: str | None,
        first: AttemptResult,
    ) -> AttemptResult:
        """The rest of an attempt whose first answer, ``first``, was a redirect to follow
        (sent from another thread); ``first`` itself if it is not one."""
        hop = None
        if first.status is not None:
            hop = next_hop(
                first.status,
                first.location,
                method=method,
                url=url,
                headers=headers,
                body=body,
                hops=0,
            )
        if hop is None:
            return first
        return self._send_once(
            hop.method,
            hop.url,
            hop.headers,
            hop.body,
            timeout,
            fault=fault,
            hops=1,
            started=first.started_us,
        )

    def lose_response(self, result: AttemptResult) -> AttemptResult:
        """``result``, or no answer when the lost-response fault strikes an answered one."""
        if result.status is None or not self.faults.roll(self.faults.lost_response):
            return result
        return AttemptResult(
            None,
            result.outcome,
            "response lost (injected fault)",
            None,
            result.started_us,
            result.finished_us,
            "lost_response",
        )

    def _send_once(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes,
        timeout: float,
        *,
        fault: str | None,
        hops: int = 0,
        started: int | None = None,
    ) -> AttemptResult:
        """One attempt, following the target's redirects (emulator.redirects) within it."""
        started = _now_us() if started is None else started
        deadline = time.monotonic() + timeout
        while True:
            answer = self._exchange(
                method, url, headers, body, deadline=deadline, started=started, fault=fault
            )
            if isinstance(answer, AttemptResult):
                return answer
            status, location, outcome, after = answer
            hop = next_hop(
                status, location, method=method, url=url, headers=headers, body=body, hops=hops
            )
            if hop is None or time.monotonic() >= deadline:
                return AttemptResult(
                    status,
                    outcome,
                    None,
                    retry_after(after),
                    started,
                    _now_us(),
                    fault,
                    bounded_text(location),
                )
            method, url, headers, body = hop.method, hop.url, hop.headers, hop.body
            hops += 1

    def _exchange(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes,
        *,
        deadline: float,
        started: int,
        fault: str | None,
    ) -> AttemptResult | tuple[int, str | None, str | None, str | None]:
        """One request: its status, Location, outcome and Retry-After, or the failed
        attempt's result."""
        try:
            # urllib3's parser, as before: the same percent-encoding and dot-segment removal.
            parsed = parse_url(url)
        except ValueError as exc:
            return AttemptResult(None, None, _describe(exc), None, started, _now_us(), fault)
        scheme = parsed.scheme or "http"
        origin: Origin = (scheme, parsed.host or "", parsed.port or _DEFAULT_PORTS.get(scheme, 80))
        connection = self._connections.take(origin, max(0.001, deadline - time.monotonic()))
        # A kept-alive connection the target closed before answering a byte (it timed the
        # connection out as the request went out, after the pool's check) is replaced by a new
        # one and the request sent again, once, as the dispatcher's exchanges do.
        resend = connection.sock is not None
        try:
            # http.client raises ValueError on some malformed answers (a negative chunk
            # size): a failed attempt, like any other bad answer, not the request's error.
            try:
                while True:
                    try:
                        response = _request(
                            connection,
                            method=method,
                            target=parsed.request_uri,
                            headers=headers,
                            body=body,
                            deadline=deadline,
                        )
                        break
                    except ConnectionError:  # RemoteDisconnected too: no status line came.
                        if not resend:
                            raise
                    connection.close()
                    left = max(0.001, deadline - time.monotonic())
                    connection, resend = self._connections.fresh(origin, left), False
                drained = _drain(response)
            except ValueError as exc:
                raise http.client.HTTPException(f"malformed answer: {exc}") from exc
        except TimeoutError:
            connection.close()
            return AttemptResult(
                None, None, "no answer within the deadline", None, started, _now_us(), fault
            )
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            return AttemptResult(None, None, _describe(exc), None, started, _now_us(), fault)
        except BaseException:  # A header that cannot be sent, say: the caller's to handle.
            connection.close()
            raise
        if response.will_close or not drained:
            connection.close()
        else:
            self._connections.give_back(origin, connection)
        return (
            response.status,
            response.getheader("Location"),
            bounded_text(response.getheader(OUTCOME_HEADER)),
            response.getheader("Retry-After"),
        )


def _request(
    connection: http.client.HTTPConnection,
    *,
    method: str,
    target: str,
    headers: dict[str, str],
    body: bytes,
    deadline: float,
) -> http.client.HTTPResponse:
    """Send the request and read the answer's head."""
    connection.request(method, target, body=body, headers=without_framing(headers))
    # The deadline covers the whole attempt, as urllib3's total timeout did: what is left of
    # it once the request is sent bounds the wait for the answer.
    if connection.sock is not None:
        connection.sock.settimeout(max(0.001, deadline - time.monotonic()))
    return connection.getresponse()


def _drain(response: http.client.HTTPResponse) -> bool:
    """Read the answer's body in pieces, keeping none of it (nothing of it is recorded);
    False if it is longer than :data:`MAX_DRAINED_BYTES` and was left unread (the connection
    then cannot be reused)."""
    left = MAX_DRAINED_BYTES
    while left > 0:
        piece = response.read(min(_READ_BYTES, left))
        if not piece:
            # read(amt) returns b"" where read() raises for a body cut short (CPython's
            # http.client keeps that for compatibility): the attempt failed all the same.
            if response.length:
                raise http.client.IncompleteRead(b"", response.length)
            return True
        left -= len(piece)
    return not response.read(1)


def bounded_text(value: str | None) -> str | None:
    """A header value from a target, cut to what the delivery log keeps."""
    return value[:MAX_RECORDED_TEXT] if value is not None else None


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def retry_after(value: str | None) -> float | None:
    """Seconds in a target's Retry-After, at most :data:`MAX_RETRY_AFTER_SECONDS`; None for
    none, an HTTP date or anything else that is not a number of seconds."""
    try:
        seconds = float(value) if value else None
    except ValueError:
        return None  # An HTTP date: not worth the parsing here.
    if seconds is None or math.isnan(seconds):
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_SECONDS)


def _now_us() -> int:
    return time.time_ns() // 1000
