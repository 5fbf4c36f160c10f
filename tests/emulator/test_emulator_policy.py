from __future__ import annotations

import pytest

from tasklease.emulator.policy import RetrySettings, TokenBucket, backoff, gives_up


def test_backoff_doubles_then_grows_linearly_then_caps() -> None:
    settings = RetrySettings(min_backoff=10, max_backoff=300, max_doublings=3)
    assert [backoff(settings, n) for n in range(1, 9)] == [10, 20, 40, 80, 160, 240, 300, 300]


def test_default_backoff_starts_at_a_tenth_of_a_second() -> None:
    assert [backoff(RetrySettings(), n) for n in (1, 2, 3)] == [0.1, 0.2, 0.4]


@pytest.mark.parametrize(
    ("max_attempts", "max_duration", "attempts", "elapsed", "expected"),
    [
        (5, 0, 4, 1e9, False),
        (5, 0, 5, 0, True),
        (-1, 0, 10_000, 1e9, False),
        (-1, 60, 10_000, 59, False),
        (-1, 60, 1, 60, True),
        (5, 60, 5, 30, False),  # Both limits must be reached.
        (5, 60, 3, 90, False),
        (5, 60, 5, 60, True),
    ],
)
def test_give_up_needs_both_limits(
    max_attempts: int, max_duration: float, attempts: int, elapsed: float, expected: bool
) -> None:
    settings = RetrySettings(max_attempts=max_attempts, max_retry_duration=max_duration)
    assert gives_up(settings, attempts, elapsed) is expected


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate=10, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0, 0, 0]
    assert bucket.take(0.0) == pytest.approx(0.1)
    assert bucket.take(0.1) == 0


def test_throttle_halves_the_rate_and_recover_restores_it() -> None:
    bucket = TokenBucket(rate=8, burst=1, now=0.0)
    bucket.take(0.0)
    bucket.throttle()
    assert bucket.effective_rate == 4
    assert bucket.take(0.0) == pytest.approx(0.25)
    bucket.recover()
    assert bucket.effective_rate == 8
