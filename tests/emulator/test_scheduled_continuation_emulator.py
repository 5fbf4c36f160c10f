"""A scheduled job fired by the emulator's Cloud Scheduler continues in Cloud Tasks tasks on
its own route and completes once: the real emulator, a gunicorn worker with OIDC on, SQLite.
With duplicates and lost responses injected on every delivery, each continuation is created
once, each page's step runs once, and the run completes once with the last state."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from tasklease.emulator import CloudTasksEmulator, DeliveryRecord, Faults, Job, RetrySettings
from tasklease.plumbing.serve import GunicornWorker, free_port
from tasklease.worker.core import steps
from tasklease.worker.core.records import RunRecord, RunStatus
from tests.faults.harness import sqlite_records
from tests.faults.steps_ledger import StepsLedger

SA = "runner@p.iam.gserviceaccount.com"  # The job's and the producer's: one caller per run.
QUEUE = "projects/p/locations/us-central1/queues/reports"
SLOT = datetime(2026, 10, 16, 3, 0, tzinfo=UTC)


def run_chain(
    tmp_path: Path, pages: int, faults: Faults
) -> tuple[RunRecord, list[DeliveryRecord], StepsLedger]:
    """Fire the nightly job's slot twice (a duplicate Scheduler run) and wait until its run
    completes; return its record, every delivery the emulator made, and the ledger."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    retry = RetrySettings(max_attempts=5, min_backoff=0.1, max_backoff=0.5)
    job = Job("nightly", "0 3 * * *", f"{url}/jobs/nightly", service_account=SA, retry=retry)
    with CloudTasksEmulator(
        data_dir=tmp_path / "emulator", faults=faults, jobs=[job], scheduler_on_schedule=False
    ) as emulator:
        emulator.create_queue(
            QUEUE, retryConfig={"minBackoff": "0.1s", "maxBackoff": "0.5s", "maxAttempts": -1}
        )
        env = {
            "CHAIN_LEDGER": str(tmp_path / "ledger.db"),
            "CHAIN_PAGES": str(pages),
            "TASKLEASE_ALLOWED_SERVICE_ACCOUNTS": SA,
            "TASKLEASE_OIDC_CERTS_URL": emulator.certs_url,
            "TASKLEASE_AUDIENCE": url,
            "TASKLEASE_PROJECT": "p",
            "TASKLEASE_LOCATION": "us-central1",
            "TASKLEASE_QUEUE": "default",  # Not the job's: its declared queue is "reports".
            "TASKLEASE_WORKER_URL": url,
            "TASKLEASE_SERVICE_ACCOUNT": SA,
            "TASKLEASE_TASKS_ENDPOINT": emulator.url,
        }
        StepsLedger(tmp_path / "ledger.db")  # Created before two workers race to.
        worker = GunicornWorker(
            "tests.support.scheduled_chain_app:router",
            store=f"sqlite:///{tmp_path}/runs.db",
            auth="oidc",
            workers=2,
            port=port,
            env=env,
            log_path=tmp_path / "worker.log",
        )
        with worker:
            for _ in range(2):  # The slot's run, then a duplicate of it: both answered 200.
                assert emulator.scheduler.run_job("nightly", SLOT).result(timeout=60)
            deadline = time.monotonic() + 120
            while (record := _only_record(tmp_path / "runs.db")) is None or (
                record.status is not RunStatus.COMPLETED
            ):
                assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
                time.sleep(0.2)
            emulator.join(timeout=60)
            deliveries = emulator.deliveries()
    return record, deliveries, StepsLedger(tmp_path / "ledger.db")


def _only_record(path: Path) -> RunRecord | None:
    records = list(sqlite_records(path).values()) if path.exists() else []
    assert len(records) <= 1, records  # One scheduled run, however many deliveries.
    return records[0] if records else None


def test_a_scheduled_job_continues_three_times_through_the_emulator_and_completes_once(
    tmp_path: Path,
) -> None:
    record, deliveries, ledger = run_chain(tmp_path, pages=4, faults=Faults())
    assert record.kind == "scheduler" and record.handler == "nightly"
    assert record.result == {"pages": 4, "job": "nightly", "slot": str(SLOT)}
    assert record.identity["job_name"] == "nightly"
    assert steps.continuation_of(record).seq == 3
    assert steps.continuation_of(record).state == {"page": 3}
    scheduler = [d for d in deliveries if d.kind == "scheduler"]
    tasks = [d for d in deliveries if d.kind == "task"]
    assert [d.status for d in scheduler] == [200, 200]  # Scheduler retries nothing.
    assert [d.outcome for d in scheduler] == ["processed", "duplicate"]
    # A continuation may arrive before its run's record names it: answered 409, retried.
    assert {d.outcome for d in tasks} <= {"processed", "in_progress"}
    processed = Counter(d.name for d in tasks if d.outcome == "processed")
    assert len(processed) == 3 and set(processed.values()) == {1}
    assert {d.queue for d in tasks} == {QUEUE}  # The handler's declared queue.
    assert {d.url for d in tasks} == {scheduler[0].url}  # The job's own route.
    assert sorted(step for _, step, _ in ledger.effects()) == [f"page-{n}" for n in range(4)]
    assert len(ledger.calls()) == 4


def test_a_scheduled_chain_with_duplicates_and_lost_responses_completes_once_with_its_last_state(
    tmp_path: Path,
) -> None:
    pages = 12
    faults = Faults(lost_response=0.3, duplicate=0.3, seed=29)
    record, deliveries, ledger = run_chain(tmp_path, pages=pages, faults=faults)
    tasks = [d for d in deliveries if d.kind == "task"]
    faulted = Counter(d.fault for d in tasks)
    ran = [d for d in deliveries if d.outcome == "processed"]
    print(
        f"\nscheduled-chain: deliveries={len(deliveries)} tasks={len({d.name for d in tasks})} "
        f"lost_responses={faulted['lost_response']} duplicates={faulted['duplicate']}"
    )
    assert faulted["lost_response"] > 0 and faulted["duplicate"] > 0
    assert len({d.name for d in tasks}) == pages - 1  # Each continuation created once.
    assert record.status is RunStatus.COMPLETED
    assert record.result == {"pages": pages, "job": "nightly", "slot": str(SLOT)}
    assert steps.continuation_of(record).seq == pages - 1
    assert steps.continuation_of(record).state == {"page": pages - 1}
    assert list(steps.steps_of(record)) == [f"page-{pages - 1}"]
    assert len(ledger.effects()) == pages
    assert len(ledger.calls()) == pages  # No page's step ran twice.
    # The slot's delivery and each continuation ran the handler once.
    assert Counter(d.name for d in ran) == dict.fromkeys({d.name for d in ran}, 1)
    assert len({d.name for d in ran}) == pages
