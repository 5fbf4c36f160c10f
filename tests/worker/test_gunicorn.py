"""The worker under a real gunicorn server: 2 worker processes sharing one SQLite file."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from tasklease.demo.ledger import Ledger
from tasklease.plumbing.serve import GunicornWorker
from tests.support.helpers import task_headers


def test_twenty_concurrent_deliveries_of_one_task_run_the_handler_once(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    server = GunicornWorker(
        "tests.support.apps:router",
        store=f"sqlite:///{tmp_path}/runs.db",
        workers=2,
        env={"TEST_LEDGER": str(ledger)},
        log_path=tmp_path / "gunicorn.log",
    )
    with server, ThreadPoolExecutor(20) as pool:

        def deliver(attempt: int) -> requests.Response:
            return requests.post(
                f"{server.url}/tasks/slow_receipt",
                json={"order_id": 7},
                headers=task_headers(retry=attempt),
                timeout=30,
            )

        responses = list(pool.map(deliver, range(20)))
        outcomes = Counter(r.headers["X-Tasklease-Outcome"] for r in responses)
        # Once it has completed, every later delivery is a duplicate.
        late = requests.post(
            f"{server.url}/tasks/slow_receipt",
            json={"order_id": 7},
            headers=task_headers(),
            timeout=30,
        )
    assert outcomes["processed"] == 1
    assert outcomes["processed"] + outcomes["in_progress"] + outcomes["duplicate"] == 20
    assert {r.status_code for r in responses} <= {200, 409}
    assert late.headers["X-Tasklease-Outcome"] == "duplicate"
    assert Ledger(ledger).counts() == Counter({"receipt:7": 1})
    pids = {r.json()["result"]["pid"] for r in responses if r.json().get("result")}
    assert len(pids) == 1
