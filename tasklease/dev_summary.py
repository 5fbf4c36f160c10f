"""``tasklease dev``: one line a minute on what the emulator delivered to the worker.

Seen from the emulator (the one process that sees every attempt, whatever the number of
gunicorn workers): deliveries, their outcomes (the worker's ``X-Tasklease-Outcome``, else the
HTTP status) and the p50/p99 of the round trip, handler included.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from types import TracebackType

from tasklease.emulator import metrics as emulator_metrics
from tasklease.emulator.sender import AttemptResult

_log = logging.getLogger("tasklease.dev")


class MinuteSummary:
    """Collects attempts from the emulator and logs a summary every ``interval`` seconds."""

    def __init__(self, interval: float = 60.0) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._outcomes: Counter[str] = Counter()
        self._latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tasklease-summary", daemon=True)

    def observe(self, queue: str, result: AttemptResult) -> None:
        """An emulator listener: count one attempt."""
        if result.outcome:
            outcome = result.outcome
        elif result.status is not None:
            outcome = f"HTTP {result.status}"
        else:
            outcome = "no answer"
        with self._lock:
            self._outcomes[outcome] += 1
            self._latencies.append(result.duration_ms)

    def take_line(self) -> str:
        """The summary of the attempts since the last line, and start counting afresh."""
        with self._lock:
            outcomes, self._outcomes = self._outcomes, Counter()
            latencies, self._latencies = sorted(self._latencies), []
        if not latencies:
            return "last minute: no deliveries"
        counts = ", ".join(f"{name} {count}" for name, count in outcomes.most_common())
        return (
            f"last minute: {len(latencies)} deliver{'y' if len(latencies) == 1 else 'ies'} "
            f"({counts}); "
            f"p50 {_percentile(latencies, 50):.1f} ms, p99 {_percentile(latencies, 99):.1f} ms"
        )

    def __enter__(self) -> MinuteSummary:
        emulator_metrics.add_listener(self.observe)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        emulator_metrics.remove_listener(self.observe)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            _log.info(self.take_line())


def _percentile(ordered: list[float], percent: float) -> float:
    """Nearest-rank percentile of a sorted, non-empty list."""
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]
