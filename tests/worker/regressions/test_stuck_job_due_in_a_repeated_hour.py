"""Finding: in the hour a fall-back change repeats, the stuck-jobs check (``tasklease runs
stuck``, the dashboard) took a slot of the hour's second pass for the last slot of a moment in
its first pass, and reported a job overdue for a slot that had not come yet.

It found the last slot by comparing croniter's times with the moment as wall times: two
datetimes with the same ZoneInfo compare without their ``fold``, so 02:30 CET (01:30 UTC)
counted as at or before 02:47 CEST (00:47 UTC). The stub scheduler's own algorithm had it
right; both now use tasklease.cron, which compares instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from tasklease.worker.operate.stuck_schedules import load_schedules, overdue_jobs
from tasklease.worker.stores import MemoryStore
from tests.support.helpers import claim_request


def test_a_job_that_ran_its_last_slot_is_not_overdue_in_a_repeated_hour(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        '[[job]]\nname = "halfhourly"\nschedule = "*/30 * * * *"\ntime_zone = "Europe/Paris"\n'
    )
    slot = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST, the first 02:30 that day.
    store = MemoryStore()
    identity = {"job_name": "halfhourly", "schedule_time": "2026-10-25T00:30:00Z"}
    request = claim_request("run", kind="scheduler", handler="halfhourly", identity=identity)
    store.claim(request, slot)
    store.complete("run", "attempt-1", None, slot + timedelta(seconds=5))
    now = datetime(2026, 10, 25, 1, 2, tzinfo=UTC)  # 02:02 CET; with 15 min grace, 02:47 CEST.
    assert overdue_jobs(store, load_schedules(jobs), now) == []
