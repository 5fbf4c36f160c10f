"""Backoff with jitter for retrying a create. Pure."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a transient create error is retried.

    Delays grow exponentially from ``initial`` to ``maximum`` seconds with "full jitter" (a
    random delay between 0 and the cap), which spreads the retries of many producers out.
    """

    max_attempts: int = 5
    initial: float = 0.1
    maximum: float = 5.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not 0 <= self.initial <= self.maximum:
            raise ValueError("need 0 <= initial <= maximum")

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The pause before each retry: ``max_attempts - 1`` of them."""
        uniform = (rng or random).uniform
        for attempt in range(self.max_attempts - 1):
            cap = min(self.maximum, self.initial * self.multiplier**attempt)
            yield uniform(0, cap)
