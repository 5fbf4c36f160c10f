"""Delivers due tasks to their targets under each queue's rate limits and retry policy."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from emulator import metrics as emulator_metrics
from emulator import model
from emulator.db import DeliveryRecord, EmulatorDB, TaskRow
from emulator.oidc import TokenIssuer
from emulator.policy import TokenBucket, backoff, gives_up
from emulator.routing import route
from emulator.sender import AttemptResult, Sender
from emulator.workers import Workers

_log = logging.getLogger("tasklease.emulator")
_BATCH_SECONDS = 0.002


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
        self._pool = Workers(max_threads, "emulator-dispatch")
        self._states: dict[str, _QueueState] = {}
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._woken = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="emulator-dispatcher", daemon=True)
        self._next_tombstone_sweep = 0.0
        self._run_again: set[str] = set()  # RunTask on tasks in flight.

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self.wake()
        self._thread.join(timeout=10)
        self._pool.stop()

    def wake(self) -> None:
        """Look for due tasks now (a task was created, a queue resumed, a dispatch ended)."""
        if self._woken:
            # Already woken: the loop clears the flag before its next pass, so that pass
            # sees what this call was about (it happened before this call).
            return
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

    def run_now(self, name: str) -> None:
        """RunTask: dispatch now, whatever the schedule or queue state. A task in flight is
        dispatched again as soon as its attempt ends, unless that attempt succeeded."""
        row = self._db.claim_for_dispatch(name)
        if row is None:
            with self._lock:
                self._run_again.add(name)
            # The attempt may have ended between the two steps: then the task is pending.
            row = self._db.claim_for_dispatch(name)
            if row is None:
                return
            with self._lock:
                self._run_again.discard(name)
        config = self._db.get_queue(row.queue)
        if config is None:
            return
        state = self._state(row.queue, config)
        with self._lock:
            state.in_flight += 1
        self._pool.submit(partial(self._dispatch, row, config, state))

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
            # One pass for a burst of creates and finished dispatches, not one pass each.
            self._stopping.wait(_BATCH_SECONDS)

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
                self._pool.submit(partial(self._dispatch, row, config, state))
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
                retry_reason=None,
            )
        finally:
            with self._lock:
                state.in_flight -= 1
            self.wake()

    def _attempt(self, row: TaskRow, config: dict[str, Any], state: _QueueState) -> None:
        request = route(row.spec["httpRequest"], config.get("httpTarget"))
        url = request.url
        headers = request.headers
        headers.setdefault("User-Agent", "Google-Cloud-Tasks")
        # The headers Cloud Tasks adds to every HTTP-target request (platform-facts.md).
        headers["X-CloudTasks-QueueName"] = row.queue.rsplit("/", 1)[-1]
        headers["X-CloudTasks-TaskName"] = row.name.rsplit("/", 1)[-1]
        headers["X-CloudTasks-TaskRetryCount"] = str(row.dispatch_count)
        headers["X-CloudTasks-TaskExecutionCount"] = str(row.execution_count)
        headers["X-CloudTasks-TaskETA"] = f"{row.schedule_us / 1e6:.6f}"
        # Only on a retry of an attempt that got an answer; the reason is empty for HTTP
        # targets (captured from production: aertje/cloud-tasks-emulator#114).
        if row.previous_response is not None:
            headers["X-CloudTasks-TaskPreviousResponse"] = str(row.previous_response)
        if row.retry_reason is not None:
            headers["X-CloudTasks-TaskRetryReason"] = row.retry_reason
        if request.service_account:
            token = self._issuer.mint(request.service_account, request.audience or url)
            headers["Authorization"] = f"Bearer {token}"
        body = request.body
        deadline = model.seconds_of(
            row.spec.get("dispatchDeadline"), model.DEFAULT_DISPATCH_DEADLINE
        )
        result, duplicate = self._sender.send(request.method, url, headers, body, deadline)
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
            run_again = row.name in self._run_again
            self._run_again.discard(row.name)
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
        if result.status is None:
            _log.info("attempt of %s got no answer: %s", row.name, result.error)
        self._db.finish_attempt(
            row.name,
            delete=False,
            now_us=now_us,
            schedule_us=now_us + int(delay * 1_000_000),
            responded=result.status is not None,
            executed=result.status is not None and result.status < 500,
            attempt=attempt,
            previous_response=result.status,
            retry_reason="" if result.status is not None else None,
            deliveries=deliveries,
        )
        if run_again:  # RunTask came during this attempt: dispatch now, even if paused.
            self.run_now(row.name)

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
