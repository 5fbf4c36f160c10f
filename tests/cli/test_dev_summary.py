"""The one-line-a-minute summary `tasklease dev` prints from the emulator's attempts."""

from __future__ import annotations

import logging

import pytest

from tasklease.cli.dev import MinuteSummary
from tasklease.emulator import metrics as emulator_metrics
from tasklease.emulator.sender import AttemptResult


def attempt(status: int | None, outcome: str | None, ms: float) -> AttemptResult:
    return AttemptResult(status, outcome, None, None, 0, int(ms * 1000))


def test_line_counts_outcomes_and_gives_p50_and_p99() -> None:
    summary = MinuteSummary()
    for n in range(1, 101):
        summary.observe("q", attempt(200, "processed" if n <= 90 else "duplicate", n))
    summary.observe("q", attempt(None, None, 500))
    summary.observe("q", attempt(404, None, 1))
    assert summary.take_line() == (
        "last minute: 102 deliveries (processed 90, duplicate 10, no answer 1, HTTP 404 1); "
        "p50 50.0 ms, p99 100.0 ms"
    )
    assert summary.take_line() == "last minute: no deliveries"


def test_summary_listens_to_the_emulator_and_logs_each_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tasklease.dev")
    with MinuteSummary(interval=0.05) as summary:
        queue = "projects/p/locations/l/queues/q"
        emulator_metrics.attempted(queue, 0, attempt(200, "processed", 3))
        for _ in range(100):
            lines = [r.getMessage() for r in caplog.records if r.name == "tasklease.dev"]
            if lines:
                break
            summary._stop.wait(0.02)
    assert lines[0] == "last minute: 1 delivery (processed 1); p50 3.0 ms, p99 3.0 ms"
    assert summary.observe not in emulator_metrics._listeners
