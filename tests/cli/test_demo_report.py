"""The demo's closing table says why Cloud Scheduler gave up on a run when it did: each
Scheduler attempt with its answer, so a failed demo can be read without its work folder."""

from __future__ import annotations

import io
from collections import Counter

from tasklease.demo.run import _Report
from tasklease.emulator.rows import DeliveryRecord


def attempt(n: int, status: int | None, outcome: str | None) -> DeliveryRecord:
    return DeliveryRecord(
        kind="scheduler", queue=None, name="nightly_export@2026-12-02T04:00:00Z",
        url="http://127.0.0.1:1/jobs/nightly_export", attempt=n, status=status,
        outcome=outcome, fault=None, error=None, started_us=n, duration_ms=1.0,
    )  # fmt: skip


def report() -> _Report:
    return _Report(
        tasks_enqueued=0, enqueue_duplicates=0, deliveries=2, injected_duplicates=0,
        injected_lost=0, absorbed=0, executions={"receipt": Counter({"order-1": 1})},
        missing=Counter(), skipped_overlaps=0, keys_busy=0,
        scheduler_attempts=[attempt(1, 409, "in_progress"), attempt(2, 200, "duplicate")],
    )  # fmt: skip


def test_a_run_scheduler_gave_up_on_prints_every_scheduler_attempt() -> None:
    out = io.StringIO()
    report().print(out, 1.0, run_ok=False)
    text = out.getvalue()
    assert "nightly_export@2026-12-02T04:00:00Z #1: 409 in_progress" in text
    assert "nightly_export@2026-12-02T04:00:00Z #2: 200 duplicate" in text


def test_a_run_that_succeeded_prints_no_attempts() -> None:
    out = io.StringIO()
    report().print(out, 1.0, run_ok=True)
    assert "Cloud Scheduler's attempts" not in out.getvalue()
