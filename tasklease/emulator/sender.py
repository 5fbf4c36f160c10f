"""Sending one attempt to a target over HTTP, with fault injection."""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass

from urllib3.util import parse_url

from tasklease.emulator.connections import Connections, Origin
from tasklease.emulator.faults import Faults

OUTCOME_HEADER = "X-Tasklease-Outcome"  # Recorded when the target is a tasklease worker.
_DEFAULT_PORTS = {"http": 80, "https": 443}


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
    ) -> AttemptResult:
        started = _now_us()
        deadline = time.monotonic() + timeout
        try:
            # urllib3's parser, as before: the same percent-encoding and dot-segment removal.
            parsed = parse_url(url)
        except ValueError as exc:
            return AttemptResult(None, None, _describe(exc), None, started, _now_us(), fault)
        scheme = parsed.scheme or "http"
        origin: Origin = (scheme, parsed.host or "", parsed.port or _DEFAULT_PORTS.get(scheme, 80))
        connection = self._connections.take(origin, timeout)
        try:
            connection.request(method, parsed.request_uri, body=body, headers=headers)
            # The deadline covers the whole attempt, as urllib3's total timeout did: what is
            # left of it once the request is sent bounds the wait for the answer.
            if connection.sock is not None:
                connection.sock.settimeout(max(0.001, deadline - time.monotonic()))
            # http.client raises ValueError on some malformed answers (a negative chunk
            # size): a failed attempt, like any other bad answer, not the request's error.
            try:
                response = connection.getresponse()
                response.read()
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
        finished = _now_us()
        if response.will_close:
            connection.close()
        else:
            self._connections.give_back(origin, connection)
        return AttemptResult(
            response.status,
            response.getheader(OUTCOME_HEADER),
            None,
            retry_after(response.getheader("Retry-After")),
            started,
            finished,
            fault,
        )


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None  # An HTTP date: not worth the parsing here.


def _now_us() -> int:
    return time.time_ns() // 1000
