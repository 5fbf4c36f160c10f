"""Delivers due tasks to their targets under each queue's rate limits and retry policy."""

from __future__ import annotations

import base64
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from emulator import metrics as emulator_metrics
from emulator import model
from emulator.db import DeliveryRecord, EmulatorDB, TaskRow
from emulator.oidc import TokenIssuer
from emulator.policy import TokenBucket, backoff, gives_up
from emulator.sender import AttemptResult, Sender

_log = logging.getLogger("tasklease.emulator")


@dataclass
class _QueueState:
    bucket: TokenBucket
    in_flight: int = 0


class Dispatcher:
    """One loop thread picks due tasks; a thread pool sends them.

    Per queue: at most ``maxConcurrentDispatches`` in flight, at most
    ``maxDispatchesPerSecond`` started per second (a token bucket that halves its rate after a
    429 or 503 and recovers after successes). A failed attempt is retried after the queue's
    backoff (or the target's Retry-After on 429/503, if longer) until the RetryConfig gives up.
    """

    def __init__(
        self,
        db: EmulatorDB,
        issuer: TokenIssuer,
        sender: Sender,
        *,
        dedup_window: float,
        max_threads: int = 128,
    ) -> None:
        self._db = db
        self._issuer = issuer
        self._sender = sender
        self._dedup_window = dedup_window
        self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix="emulator-dispatch")
        self._states: dict[str, _QueueState] = {}
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._woken = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="emulator-dispatcher", daemon=True)
        self._next_tombstone_sweep = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self.wake()
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def wake(self) -> None:
        """Look for due tasks now (a task was created, a queue resumed, a dispatch ended)."""
        with self._wakeup:
            self._woken = True
            self._wakeup.notify()

    def in_flight(self, queue: str | None = None) -> int:
        with self._lock:
            if queue is not None:
                state = self._states.get(queue)
                return state.in_flight if state else 0
            return sum(state.in_flight for state in self._states.values())

    def rate(self, queue: str) -> float:
        """The queue's dispatch rate now: its maximum, lowered after 429/503 answers."""
        with self._lock:
            state = self._states.get(queue)
            return state.bucket.effective_rate if state else 0.0

    def run_now(self, name: str) -> bool:
        """RunTask: dispatch now, whatever the schedule or queue state. False if in flight."""
        row = self._db.claim_for_dispatch(name)
        if row is None:
            return False
        config = self._db.get_queue(row.queue)
        if config is None:
            return False
        state = self._state(row.queue, config)
        with self._lock:
            state.in_flight += 1
        self._pool.submit(self._dispatch, row, config, state)
        return True

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                wait = self._dispatch_due()
            except Exception:
                _log.exception("dispatcher loop failed; retrying")
                wait = 1.0
            with self._wakeup:
                if not self._woken:
                    self._wakeup.wait(timeout=max(0.001, wait))
                self._woken = False

    def _dispatch_due(self) -> float:
        """Start every dispatch that is due and allowed; return seconds until the next check."""
        now = time.time()
        now_us = int(now * 1_000_000)
        self._sweep_tombstones(now)
        next_check = 1.0
        for config in self._db.all_queues():
            if config.get("state") != "RUNNING":
                continue
            name = config["name"]
            state = self._state(name, config)
            with self._lock:
                available = int(config["rateLimits"]["maxConcurrentDispatches"]) - state.in_flight
            if available <= 0:
                continue
            with self._lock:
                allowed = state.bucket.take_up_to(available, time.monotonic())
            rows = self._db.claim_due(name, now_us, allowed)
            with self._lock:
                state.bucket.give_back(allowed - len(rows))
                state.in_flight += len(rows)
            for row in rows:
                self._pool.submit(self._dispatch, row, config, state)
            if len(rows) == allowed < available and self._db.has_due(name, now_us):
                with self._lock:  # Rate-limited: come back when the next token is there.
                    next_check = min(next_check, state.bucket.wait(time.monotonic()))
            elif len(rows) < available:
                upcoming = self._db.next_schedule(name)
                if upcoming is not None:
                    next_check = min(next_check, max(0.0, (upcoming - now_us) / 1e6))
        return next_check

    def _dispatch(self, row: TaskRow, config: dict[str, Any], state: _QueueState) -> None:
        try:
            self._attempt(row, config, state)
        except Exception:
            _log.exception("dispatch of %s failed", row.name)
            self._db.finish_attempt(
                row.name,
                delete=False,
                now_us=_now_us(),
                schedule_us=_now_us() + 1_000_000,
                responded=False,
                attempt={},
                previous_response=None,
                retry_reason="emulator error",
            )
        finally:
            with self._lock:
                state.in_flight -= 1
            self.wake()

    def _attempt(self, row: TaskRow, config: dict[str, Any], state: _QueueState) -> None:
        http = row.spec["httpRequest"]
        url = http["url"]
        headers = dict(http.get("headers") or {})
        headers.setdefault("User-Agent", "Google-Cloud-Tasks")
        # The headers Cloud Tasks adds to every HTTP-target request (platform-facts.md).
        headers["X-CloudTasks-QueueName"] = row.queue.rsplit("/", 1)[-1]
        headers["X-CloudTasks-TaskName"] = row.name.rsplit("/", 1)[-1]
        headers["X-CloudTasks-TaskRetryCount"] = str(row.dispatch_count)
        headers["X-CloudTasks-TaskExecutionCount"] = str(row.response_count)
        headers["X-CloudTasks-TaskETA"] = f"{row.schedule_us / 1e6:.6f}"
        if row.previous_response is not None:
            headers["X-CloudTasks-TaskPreviousResponse"] = str(row.previous_response)
        if row.retry_reason:
            headers["X-CloudTasks-TaskRetryReason"] = row.retry_reason
        oidc = http.get("oidcToken")
        if oidc and oidc.get("serviceAccountEmail"):
            audience = oidc.get("audience") or url
            token = self._issuer.mint(oidc["serviceAccountEmail"], audience)
            headers["Authorization"] = f"Bearer {token}"
        body = base64.b64decode(http.get("body") or "")
        deadline = model.seconds_of(
            row.spec.get("dispatchDeadline"), model.DEFAULT_DISPATCH_DEADLINE
        )
        result, duplicate = self._sender.send(
            http.get("httpMethod", "POST"), url, headers, body, deadline
        )
        attempt_number = row.dispatch_count + 1
        deliveries = [
            DeliveryRecord.of("task", row.queue, row.name, url, attempt=attempt_number, sent=sent)
            for sent in (result, duplicate)
            if sent is not None
        ]
        self._record(row, config, state, result, deliveries)

    def _record(
        self,
        row: TaskRow,
        config: dict[str, Any],
        state: _QueueState,
        result: AttemptResult,
        deliveries: list[DeliveryRecord],
    ) -> None:
        emulator_metrics.attempted(row.queue, row.schedule_us, result)
        now_us = _now_us()
        attempts = row.dispatch_count + 1
        first_us = row.first_attempt_us or result.started_us
        attempt = model.attempt(
            row.schedule_us,
            result.started_us,
            result.finished_us if result.status is not None else None,
            result.status,
            result.error or f"HTTP {result.status}",
        )
        with self._lock:
            if result.status in (429, 503):
                state.bucket.throttle()
            elif result.succeeded:
                state.bucket.recover()
        if result.succeeded:
            self._db.finish_attempt(
                row.name,
                delete=True,
                now_us=now_us,
                schedule_us=0,
                responded=True,
                attempt=attempt,
                previous_response=None,
                retry_reason=None,
                deliveries=deliveries,
            )
            return
        settings = model.retry_settings(config)
        if gives_up(settings, attempts, (now_us - first_us) / 1e6):
            _log.warning("giving up on %s after %d attempts", row.name, attempts)
            self._db.finish_attempt(
                row.name,
                delete=True,
                now_us=now_us,
                schedule_us=0,
                responded=result.status is not None,
                attempt=attempt,
                previous_response=result.status,
                retry_reason=None,
                deliveries=deliveries,
            )
            return
        delay = backoff(settings, attempts)
        if result.status in (429, 503) and result.retry_after is not None:
            delay = max(delay, result.retry_after)
        reason = (
            f"HTTP {result.status}" if result.status is not None else (result.error or "no answer")
        )
        self._db.finish_attempt(
            row.name,
            delete=False,
            now_us=now_us,
            schedule_us=now_us + int(delay * 1_000_000),
            responded=result.status is not None,
            attempt=attempt,
            previous_response=result.status,
            retry_reason=reason[:200],
            deliveries=deliveries,
        )

    def _state(self, name: str, config: dict[str, Any]) -> _QueueState:
        rate = float(config["rateLimits"]["maxDispatchesPerSecond"])
        burst = int(config["rateLimits"]["maxBurstSize"])
        with self._lock:
            state = self._states.get(name)
            if state is None:
                state = self._states[name] = _QueueState(TokenBucket(rate, burst, time.monotonic()))
            else:
                state.bucket.configure(rate, burst)
            return state

    def _sweep_tombstones(self, now: float) -> None:
        if now < self._next_tombstone_sweep:
            return
        self._next_tombstone_sweep = now + 60
        self._db.forget_tombstones(int((now - self._dedup_window) * 1_000_000))


def _now_us() -> int:
    return time.time_ns() // 1000
