"""Producer -> emulator -> gunicorn worker -> SQLite, with faults injected and OIDC on."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from tasklease.demo.ledger import Ledger
from tasklease.demo.run import DemoSettings, run_demo
from tasklease.emulator import CloudTasksEmulator, Faults
from tasklease.plumbing.serve import GunicornWorker
from tasklease.producer import Producer

QUEUE = "projects/p/locations/us-central1/queues/e2e"
SA = "tasks@p.iam.gserviceaccount.com"


class Stack:
    def __init__(
        self, emulator: CloudTasksEmulator, worker: GunicornWorker, ledger: Ledger
    ) -> None:
        self.emulator, self.worker, self.ledger = emulator, worker, ledger
        self.producer = Producer(
            "p", "us-central1", "e2e", worker.url, SA, tasks_endpoint=emulator.url
        )


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    faults = Faults(duplicate=0.25, lost_response=0.25, seed=11)
    with CloudTasksEmulator(data_dir=tmp_path / "emulator", faults=faults) as emulator:
        emulator.create_queue(
            QUEUE,
            retryConfig={"minBackoff": "0.05s", "maxBackoff": "1s"},
            rateLimits={"maxConcurrentDispatches": 32},
        )
        env = {
            "TEST_LEDGER": str(tmp_path / "ledger.db"),
            "TASKLEASE_ALLOWED_SERVICE_ACCOUNTS": SA,
            "TASKLEASE_OIDC_CERTS_URL": emulator.certs_url,
        }
        worker = GunicornWorker(
            "tests.support.apps:router",
            store=f"sqlite:///{tmp_path}/runs.db",
            auth="oidc",
            workers=2,
            env=env,
            log_path=tmp_path / "worker.log",
        )
        with worker:
            yield Stack(emulator, worker, Ledger(tmp_path / "ledger.db"))


def test_five_hundred_tasks_with_faults_each_have_their_side_effect_once(stack: Stack) -> None:
    results = stack.producer.enqueue_many("record", [(f"n{n}", {"n": n}) for n in range(500)])
    again = stack.producer.enqueue_many("record", [(f"n{n}", {"n": n}) for n in range(0, 500, 5)])
    assert all(r.created for r in results) and not any(r.created for r in again)
    stack.emulator.join(timeout=120)
    counts = stack.ledger.counts()
    assert len(counts) == 500
    assert set(counts.values()) == {1}
    deliveries = stack.emulator.deliveries()
    faults = Counter(d.fault for d in deliveries)
    outcomes = Counter(d.outcome for d in deliveries)
    assert faults["duplicate"] > 50 and faults["lost_response"] > 50  # Faults did happen...
    assert outcomes["duplicate"] + outcomes["in_progress"] > 100  # ...and the worker absorbed them.
    assert outcomes["processed"] == 500


def test_an_attempt_that_outlives_the_dispatch_deadline_is_not_run_twice(stack: Stack) -> None:
    stack.emulator.faults.duplicate = stack.emulator.faults.lost_response = 0.0
    stack.producer.enqueue(
        "outlives_deadline", {}, key="slow", dispatch_deadline=timedelta(seconds=15)
    )
    stack.emulator.join(timeout=60)
    assert stack.ledger.counts() == Counter({"slow:one": 1})
    deliveries = stack.emulator.deliveries()
    statuses = [d.status for d in deliveries]
    # The first attempt timed out at the deadline while its handler kept running and kept its
    # lease; retries meanwhile were told 409; the one after completion saw a duplicate.
    assert statuses[0] is None
    assert 409 in statuses
    assert deliveries[-1].outcome == "duplicate"


def test_the_demo_finds_every_side_effect_exactly_once(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_demo(DemoSettings(orders=60, customers=8, seed=5))
    output = capsys.readouterr().out
    assert code == 0, output
    assert "every side effect happened exactly once" in output
    assert "60 x 1..1" in output and "8 x 1..1" in output
    assert "1, 1 carrying the run key" in output  # One Workflows execution, from two runs.
    # The transactional charges: one move per order, in the store's database, adding up.
    assert re.search(r"charges moved in the run's transaction, per order +60 x 1\.\.1", output)
    assert "balances add up" in output
    # The checkout through the outbox: orders and their tasks committed together; the
    # abandoned checkouts (rolled back after their enqueue) left no order and no task.
    assert "checkout through the outbox adds up" in output
    assert (
        "orders committed 60, receipts created 60, rolled-back orders 6, receipts for them 0"
        in output
    )
    # Two timers fired the exclusive job at once: one run, the other skipped; no overlaps.
    assert "stock reconciliations (two timers fired)" in output
    assert "1 run skipped" in output and "; 0 overlapped" in output
    # The export: one run continued over five deliveries, each page exported once.
    assert "export pages (1 run, 5 continued deliveries)" in output
    assert re.search(r"export pages \(1 run, 5 continued deliveries\)\s+5 x 1\.\.1", output)
