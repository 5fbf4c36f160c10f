"""Sending one attempt to a target over HTTP, with fault injection."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import urllib3

from emulator.faults import Faults

OUTCOME_HEADER = "X-Tasklease-Outcome"  # Recorded when the target is a tasklease worker.


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
    """Sends attempts through one pooled HTTP session shared by the dispatch threads."""

    def __init__(self, faults: Faults, pool_size: int = 128) -> None:
        self.faults = faults
        # urllib3 directly, not requests: a dispatch's HTTP handling costs a fraction of the
        # CPU (no request preparation, settings merge or proxy look-up from the environment).
        self._pool = urllib3.PoolManager(num_pools=16, maxsize=pool_size, retries=False)

    def close(self) -> None:
        self._pool.clear()

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
        if result.status is not None and self.faults.roll(self.faults.lost_response):
            result = AttemptResult(
                None,
                result.outcome,
                "response lost (injected fault)",
                None,
                result.started_us,
                result.finished_us,
                "lost_response",
            )
        return result, (duplicate[0] if duplicate else None)

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
        try:
            response = self._pool.request(
                method,
                url,
                body=body,
                headers=headers,
                timeout=urllib3.Timeout(total=timeout),
                redirect=False,
            )
        except urllib3.exceptions.TimeoutError:
            return AttemptResult(
                None, None, "no answer within the deadline", None, started, _now_us(), fault
            )
        except urllib3.exceptions.HTTPError as exc:
            return AttemptResult(
                None, None, f"{type(exc).__name__}: {exc}"[:300], None, started, _now_us(), fault
            )
        return AttemptResult(
            response.status,
            response.headers.get(OUTCOME_HEADER),
            None,
            _retry_after(response.headers.get("Retry-After")),
            started,
            _now_us(),
            fault,
        )


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None  # An HTTP date: not worth the parsing here.


def _now_us() -> int:
    return time.time_ns() // 1000
