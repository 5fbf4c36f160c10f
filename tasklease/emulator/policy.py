"""The queue's delivery rules as pure functions: retry backoff, give-up, rate limiting.

Formulas from Cloud Tasks' RetryConfig documentation (docs/platform-facts.md, "queue settings"):
the delay starts at min_backoff, doubles max_doublings times, then grows linearly by
2^max_doublings * min_backoff per retry, capped at max_backoff. Retries stop only when both
max_attempts and max_retry_duration are reached (-1 attempts and 0 duration mean unlimited).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetrySettings:
    """A queue's RetryConfig, in seconds."""

    max_attempts: int = 100
    max_retry_duration: float = 0.0
    min_backoff: float = 0.1
    max_backoff: float = 3600.0
    max_doublings: int = 16


def backoff(settings: RetrySettings, failed_attempts: int) -> float:
    """Seconds to wait before the next attempt, after ``failed_attempts`` (>= 1) failures."""
    retry = failed_attempts - 1
    if retry <= settings.max_doublings:
        delay = settings.min_backoff * 2**retry
    else:
        step = settings.min_backoff * 2**settings.max_doublings
        delay = step + (retry - settings.max_doublings) * step
    return float(min(delay, settings.max_backoff))


def gives_up(settings: RetrySettings, attempts: int, seconds_since_first_attempt: float) -> bool:
    """Whether a task that has failed ``attempts`` times is deleted instead of retried."""
    attempts_unlimited = settings.max_attempts == -1
    duration_unlimited = settings.max_retry_duration <= 0
    attempts_reached = not attempts_unlimited and attempts >= settings.max_attempts
    duration_reached = (
        not duration_unlimited and seconds_since_first_attempt >= settings.max_retry_duration
    )
    if attempts_unlimited and duration_unlimited:
        return False
    if attempts_unlimited:
        return duration_reached
    if duration_unlimited:
        return attempts_reached
    return attempts_reached and duration_reached


class TokenBucket:
    """Rate limit of dispatches: ``rate`` tokens per second, at most ``burst`` saved up.

    ``throttle()`` halves the effective rate (a 429 or 503 from the target makes Cloud Tasks
    back off); ``recover()`` doubles it back towards ``rate`` after successes. Not thread-safe:
    the dispatcher's single loop owns it.
    """

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.factor = 1.0
        self._tokens = float(self.burst)
        self._last = now

    @property
    def effective_rate(self) -> float:
        return self.rate * self.factor

    def configure(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, max(1, burst)
        self._tokens = min(self._tokens, self.burst)

    def take(self, now: float) -> float:
        """Take a token if one is there (return 0), else return seconds until one will be."""
        if self.take_up_to(1, now):
            return 0.0
        return self.wait(now)

    def take_up_to(self, wanted: int, now: float) -> int:
        """Take as many whole tokens as are there, at most ``wanted``; return how many."""
        self._refill(now)
        taken = min(wanted, int(self._tokens))
        self._tokens -= taken
        return max(0, taken)

    def give_back(self, unused: int) -> None:
        """Return tokens taken for dispatches that did not happen."""
        self._tokens = min(float(self.burst), self._tokens + unused)

    def wait(self, now: float) -> float:
        """Seconds until the next whole token."""
        self._refill(now)
        return max(0.0, (1 - self._tokens) / self.effective_rate)

    def throttle(self) -> None:
        self.factor = max(self.factor / 2, 1 / 64)
        self._tokens = min(self._tokens, 1.0)

    def recover(self) -> None:
        self.factor = min(1.0, self.factor * 2)

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._last)
        self._last = now
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.effective_rate)
