"""Fault injection, to test exactly-once handling against the failures at-least-once allows."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field


@dataclass
class Faults:
    """Probabilities, each checked independently per attempt. All off by default.

    - ``duplicate``: the same attempt is sent twice at once (same headers), as when a front
      end retries a request the target already received.
    - ``lost_response``: the target answered, but the emulator acts as if no answer came (a
      dropped connection) and retries the task.
    """

    duplicate: float = 0.0
    lost_response: float = 0.0
    seed: int | None = None
    _random: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        for name in ("duplicate", "lost_response"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} probability must be between 0 and 1")
        self._random = random.Random(self.seed)

    def roll(self, probability: float) -> bool:
        if probability <= 0:
            return False
        with self._lock:
            return self._random.random() < probability
