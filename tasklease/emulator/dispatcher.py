"""Delivers due tasks to their targets under each queue's rate limits and retry policy.

The loop's own thread sends attempts to local plain-HTTP targets and reads their answers
(:mod:`tasklease.emulator.exchanges`), and records the attempts that ended together in one
change; attempts to other targets, and RunTask's, go to a thread each
(:mod:`tasklease.emulator.workers`) and the blocking :class:`~tasklease.emulator.sender.Sender`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from urllib3.util import parse_url

from tasklease.emulator import metrics as emulator_metrics
from tasklease.emulator import model
from tasklease.emulator.db import EmulatorDB
from tasklease.emulator.exchanges import Exchanges, direct_origin
from tasklease.emulator.oidc import TokenIssuer
from tasklease.emulator.policy import TokenBucket, backoff, gives_up
from tasklease.emulator.redirects import next_hop
from tasklease.emulator.rows import DeliveryRecord, Finish, TaskRow
from tasklease.emulator.sender import AttemptResult, Sender
from tasklease.emulator.task_request import TaskRequest, task_request, unsent
from tasklease.emulator.workers import Workers

_log = logging.getLogger("tasklease.emulator")
_BATCH_SECONDS = 0.002
_STOP_SECONDS = 10.0  # How long stop() lets attempts under way end.
_RECORD_RETRY_SECONDS = 0.5  # How soon attempts whose recording failed are recorded again.


@dataclass
class _QueueState:
    bucket: TokenBucket
    in_flight: int = 0


@dataclass(eq=False)
class _Flight:
    """An attempt sent from the loop's thread: its exchange and, with the duplicate fault,
    its twin's."""

    row: TaskRow
    config: dict[str, Any]
    state: _QueueState
    request: TaskRequest
    waiting: int
    results: dict[str, AttemptResult] = field(default_factory=dict)


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
        self._exchanges = Exchanges()
        # Attempts that ended but could not be recorded yet (the database refused the change),
        # the pool's and the loop's: their tasks stay in flight until recorded, so the loop
        # records them again. Under ``_lock``.
        self._unrecorded: list[tuple[_QueueState, Finish]] = []
        # Redirected attempts of the loop's, finished by the pool: (key, result). Under _lock.
        self._handed_back: list[tuple[Any, AttemptResult]] = []
        self._states: dict[str, _QueueState] = {}
        self._lock = threading.Lock()
        self._woken = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="emulator-dispatcher", daemon=True)
        self._next_tombstone_sweep = 0.0
        self._run_again: set[str] = set()  # RunTask on tasks in flight.

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Start nothing more; let the attempts under way end (for up to 10 s) and record
        them, as the pool's threads do."""
        self._stopping.set()
        self._exchanges.interrupt()
        self._thread.join(timeout=_STOP_SECONDS + 5)
        self._pool.stop(timeout=_STOP_SECONDS)
        self._exchanges.close()

    def wake(self) -> None:
        """Look for due tasks now (a task was created, a queue resumed, a dispatch ended)."""
        if self._woken:
            # Already woken: the loop clears the flag before its next pass, so that pass
            # sees what this call was about (it happened before this call).
            return
        self._woken = True
        self._exchanges.interrupt()

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
        next_pass = time.monotonic()
        while not self._stopping.is_set():
            now = time.monotonic()
            if self._woken:
                # One pass for a burst of creates and finished dispatches, not one each.
                next_pass = min(next_pass, now + _BATCH_SECONDS)
            if now >= next_pass:
                self._woken = False  # Before the pass: a wake during it asks for another.
                try:
                    wait = self._dispatch_due()
                except Exception:
                    _log.exception("dispatcher loop failed; retrying")
                    wait = 1.0
                next_pass = now + max(0.001, wait)
            self._poll(max(0.0, next_pass - time.monotonic()))
        stop_at = time.monotonic() + _STOP_SECONDS
        while (self._exchanges.active or self._unrecorded) and time.monotonic() < stop_at:
            self._poll(stop_at - time.monotonic())

    def _poll(self, timeout: float) -> None:
        """Wait for answers (at most ``timeout`` seconds, less if woken) and record them."""
        if self._unrecorded:
            timeout = min(timeout, _RECORD_RETRY_SECONDS)
        try:
            ended = self._exchanges.poll(timeout)
            with self._lock:
                ended += self._handed_back
                self._handed_back = []
            self._conclude(ended)
        except Exception:
            _log.exception("dispatcher loop failed to conclude attempts")

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
                self._start(row, config, state)
            if len(rows) == allowed < available and self._db.has_due(name, now_us):
                with self._lock:  # Rate-limited: come back when the next token is there.
                    next_check = min(next_check, state.bucket.wait(time.monotonic()))
            elif len(rows) < available:
                upcoming = self._db.next_schedule(name)
                if upcoming is not None:
                    next_check = min(next_check, max(0.0, (upcoming - now_us) / 1e6))
        return next_check

    def _dispatch(
        self,
        row: TaskRow,
        config: dict[str, Any],
        state: _QueueState,
        request: TaskRequest | None = None,
    ) -> None:
        """An attempt on a pool thread, with the blocking sender. An attempt that cannot be
        sent at all is a failed attempt too: the queue's retry policy ends it."""
        try:
            finish = self._attempt(
                row, config, state, request or task_request(row, config, self._issuer)
            )
        except Exception as exc:
            _log.exception("dispatch of %s failed", row.name)
            finish = self._outcome(row, config, state, unsent(exc), [])
        try:
            self._db.finish_attempts([finish])
        except Exception:
            _log.exception("could not record the attempt of %s; trying again", row.name)
            with self._lock:  # Still in flight: the loop records it on a later turn.
                self._unrecorded.append((state, finish))
            self.wake()
            return
        self._ended(state)
        self._run_again_if_asked(finish)

    def _start(self, row: TaskRow, config: dict[str, Any], state: _QueueState) -> None:
        """Send an attempt from this thread if its target allows, else from a pool thread."""
        try:
            request = task_request(row, config, self._issuer)
            target = parse_url(request.url)
            origin = direct_origin(target)
            if origin is None:  # TLS, a DNS name or an unparsable URL: the blocking way.
                self._pool.submit(partial(self._dispatch, row, config, state, request))
                return
            faults = self._sender.faults
            twin = faults.roll(faults.duplicate)
            flight = _Flight(row, config, state, request, 2 if twin else 1)
            for fault in ("duplicate", None) if twin else (None,):
                self._exchanges.start(
                    (flight, fault),
                    origin,
                    method=request.method,
                    target=target.request_uri,
                    headers=request.headers,
                    body=request.body,
                    timeout=request.deadline,
                    fault=fault,
                )
        except Exception as exc:
            _log.exception("dispatch of %s failed", row.name)
            self._record_ended([(state, self._outcome(row, config, state, unsent(exc), []))])

    def _conclude(self, ended: list[tuple[Any, AttemptResult]]) -> None:
        """Record the attempts sent from this thread that ended, in one change."""
        done: list[tuple[_QueueState, Finish]] = []
        for (flight, fault), result in ended:
            if self._redirected(flight, fault, result):
                continue
            flight.results["duplicate" if fault else "main"] = result
            flight.waiting -= 1
            if flight.waiting:
                continue
            main = self._sender.lose_response(flight.results["main"])
            twin = flight.results.get("duplicate")
            attempt = flight.row.dispatch_count + 1
            row = flight.row
            deliveries = [
                DeliveryRecord.of(
                    "task", row.queue, row.name, flight.request.url, attempt=attempt, sent=one
                )
                for one in (main, twin)
                if one is not None
            ]
            done.append(
                (flight.state, self._outcome(row, flight.config, flight.state, main, deliveries))
            )
        self._record_ended(done)

    def _redirected(self, flight: _Flight, fault: str | None, result: AttemptResult) -> bool:
        """Whether ``result`` is a redirect that the attempt follows (emulator.redirects):
        then the blocking sender sends the rest of the attempt from a pool thread and hands
        its result back to this thread, under the same key."""
        request = flight.request
        if (
            result.status is None
            or next_hop(
                result.status,
                result.location,
                method=request.method,
                url=request.url,
                headers=request.headers,
                body=request.body,
                hops=0,
            )
            is None
        ):
            return False
        left = request.deadline - (_now_us() - result.started_us) / 1e6
        if left <= 0:
            return False

        def follow() -> None:
            try:
                rest = self._sender.follow(
                    request.method,
                    request.url,
                    request.headers,
                    request.body,
                    left,
                    fault=fault,
                    first=result,
                )
            except Exception as exc:
                rest = unsent(exc)
            with self._lock:
                self._handed_back.append(((flight, fault), rest))
            self.wake()

        self._pool.submit(follow)
        return True

    def _record_ended(self, done: list[tuple[_QueueState, Finish]]) -> None:
        """Record ended attempts (with those not recorded before) in one change; if the
        database refuses it (nothing of it is committed), each on its own, and those it still
        refuses are kept and tried again on a later turn: dropping them would leave their
        tasks in flight, never dispatched again, and one of them must not hold back the
        others."""
        with self._lock:
            done, self._unrecorded = [*self._unrecorded, *done], []
        if not done:
            return
        recorded: list[tuple[_QueueState, Finish]] = []
        try:
            self._db.finish_attempts([finish for _, finish in done])
            recorded = done
        except Exception:
            _log.exception("could not record %d attempts; recording them one by one", len(done))
            for one in done:
                try:
                    self._db.finish_attempts([one[1]])
                    recorded.append(one)
                except Exception:
                    _log.exception("could not record the attempt of %s; trying again", one[1].name)
                    with self._lock:
                        self._unrecorded.append(one)
        for state, _ in recorded:
            with self._lock:
                state.in_flight -= 1
        if recorded:
            self._woken = True  # This thread: its next turn makes the pass, no interrupt.
        for _, finish in recorded:
            self._run_again_if_asked(finish)

    def _ended(self, state: _QueueState) -> None:
        """An attempt is over (recorded or not): one fewer in flight; look again."""
        with self._lock:
            state.in_flight -= 1
        self.wake()

    def _attempt(
        self, row: TaskRow, config: dict[str, Any], state: _QueueState, request: TaskRequest
    ) -> Finish:
        result, duplicate = self._sender.send(
            request.method, request.url, request.headers, request.body, request.deadline
        )
        attempt_number = row.dispatch_count + 1
        deliveries = [
            DeliveryRecord.of(
                "task", row.queue, row.name, request.url, attempt=attempt_number, sent=sent
            )
            for sent in (result, duplicate)
            if sent is not None
        ]
        return self._outcome(row, config, state, result, deliveries)

    def _outcome(
        self,
        row: TaskRow,
        config: dict[str, Any],
        state: _QueueState,
        result: AttemptResult,
        deliveries: list[DeliveryRecord],
    ) -> Finish:
        """What one attempt's result does to its task: deleted (it succeeded, or the queue's
        retry policy gives up) or rescheduled after the backoff."""
        emulator_metrics.attempted(row.queue, row.schedule_us, result)
        now_us = _now_us()
        attempts = row.dispatch_count + 1
        first_us = row.first_attempt_us or result.started_us
        with self._lock:
            if result.status in (429, 503):
                state.bucket.throttle()
            elif result.succeeded:
                state.bucket.recover()
        if result.succeeded:
            return Finish(
                row.name,
                delete=True,
                now_us=now_us,
                schedule_us=0,
                responded=True,
                attempt={},  # Not stored: the task is gone.
                previous_response=None,
                retry_reason=None,
                deliveries=deliveries,
            )
        settings = model.retry_settings(config)
        if gives_up(settings, attempts, (now_us - first_us) / 1e6):
            _log.warning("giving up on %s after %d attempts", row.name, attempts)
            return Finish(
                row.name,
                delete=True,
                now_us=now_us,
                schedule_us=0,
                responded=result.status is not None,
                attempt={},
                previous_response=result.status,
                retry_reason=None,
                deliveries=deliveries,
            )
        delay = backoff(settings, attempts)
        if result.status in (429, 503) and result.retry_after is not None:
            delay = max(delay, result.retry_after)
        if result.status is None:
            _log.info("attempt of %s got no answer: %s", row.name, result.error)
        attempt = model.attempt(
            row.schedule_us,
            result.started_us,
            result.finished_us if result.status is not None else None,
            result.status,
            result.error or f"HTTP {result.status}",
        )
        return Finish(
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

    def _run_again_if_asked(self, finish: Finish) -> None:
        """RunTask came while the task was in flight: dispatch it now (even if paused),
        unless the attempt ended it. Checked once the attempt is recorded, so a RunTask that
        finds the task in flight up to the last moment is not lost."""
        with self._lock:
            asked = finish.name in self._run_again
            self._run_again.discard(finish.name)
        if asked and not finish.delete:
            self.run_now(finish.name)

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
