"""Exclusive jobs and concurrency keys across real worker processes sharing one SQLite file.

No timing assertions: a held job waits for the test's ``go`` file, and overlaps are judged by
comparing the intervals the handlers recorded (one monotonic clock for the whole host).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests

from tasklease.plumbing.serve import GunicornWorker
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores import SqliteStore
from tests.support.helpers import job_headers, task_headers

SLOT_1, SLOT_2 = "2026-10-16T03:00:00Z", "2026-10-16T04:00:00Z"


@contextmanager
def servers(tmp_path: Path, count: int, workers: int) -> Iterator[list[GunicornWorker]]:
    """``count`` gunicorn servers (``workers`` processes each) on one SQLite file."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                GunicornWorker(
                    "tests.support.apps:router",
                    store=f"sqlite:///{tmp_path}/runs.db",
                    workers=workers,
                    threads=8,
                    env={"TEST_DIR": str(tmp_path)},
                    log_path=tmp_path / f"gunicorn-{index}.log",
                )
            )
            for index in range(count)
        ]


def intervals(tmp_path: Path) -> list[tuple[str, str, str, int, float, float]]:
    path = tmp_path / "intervals.log"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        kind, name, run_id, pid, start, end = line.split()
        rows.append((kind, name, run_id, int(pid), float(start), float(end)))
    return rows


def started_count(tmp_path: Path) -> int:
    path = tmp_path / "started.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_until(condition: Any, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


Answer = tuple[str, requests.Response]  # The slot delivered, and the worker's answer.


def race_two_slots(
    tmp_path: Path, job: str, pool: ThreadPoolExecutor, urls: list[str]
) -> tuple[Answer, Answer]:
    """Deliver two due runs of ``job`` (two slots) to two processes at once; let the job end
    only once the run that did not start has been answered. Returns (that one, the other)."""
    futures = {
        pool.submit(
            requests.post, f"{url}/jobs/{job}", headers=job_headers(job, slot), timeout=60
        ): slot
        for url, slot in zip(urls, (SLOT_1, SLOT_2), strict=True)
    }
    done, _ = wait(futures, timeout=30, return_when=FIRST_COMPLETED)
    assert done, "neither delivery was answered"
    answered = done.pop()
    assert started_count(tmp_path) == 1
    (tmp_path / "go").touch()
    [other] = [future for future in futures if future is not answered]
    return (futures[answered], answered.result()), (futures[other], other.result(timeout=60))


def test_two_processes_racing_one_exclusive_job_run_it_once_and_record_the_skip(
    tmp_path: Path,
) -> None:
    with servers(tmp_path, 2, workers=1) as running, ThreadPoolExecutor(2) as pool:
        urls = [server.url for server in running]
        (slot, skipped), (_, processed) = race_two_slots(tmp_path, "exclusive_report", pool, urls)
        duplicate = requests.post(
            f"{urls[0]}/jobs/exclusive_report",
            headers=job_headers("exclusive_report", slot),
            timeout=30,
        )
    assert (skipped.status_code, skipped.headers["X-Tasklease-Outcome"]) == (200, "skipped_overlap")
    assert processed.headers["X-Tasklease-Outcome"] == "processed"
    holder = processed.headers["X-Tasklease-Run-Id"]
    assert skipped.json()["held_by"] == holder
    assert duplicate.headers["X-Tasklease-Outcome"] == "skipped_overlap"
    store = SqliteStore(tmp_path / "runs.db")
    [record] = store.list_runs(RunStatus.SKIPPED)
    assert record.run_id == skipped.headers["X-Tasklease-Run-Id"]
    assert record.result == {"held_by": holder, "lock": "job///exclusive_report"}
    assert [row[2] for row in intervals(tmp_path)] == [holder]


def test_with_on_overlap_retry_the_second_run_runs_after_the_first_finished(
    tmp_path: Path,
) -> None:
    with servers(tmp_path, 2, workers=1) as running, ThreadPoolExecutor(2) as pool:
        urls = [server.url for server in running]
        (slot, busy), (_, first) = race_two_slots(tmp_path, "exclusive_retry", pool, urls)
        assert (busy.status_code, busy.headers["X-Tasklease-Outcome"]) == (409, "in_progress")
        assert int(busy.headers["Retry-After"]) >= 1
        assert first.headers["X-Tasklease-Outcome"] == "processed"
        # Cloud Scheduler's retry of the refused run, to either process.
        retried = requests.post(
            f"{urls[1]}/jobs/exclusive_retry",
            headers=job_headers("exclusive_retry", slot),
            timeout=30,
        )
    assert retried.headers["X-Tasklease-Outcome"] == "processed"
    rows = sorted(intervals(tmp_path), key=lambda row: row[4])
    assert [row[2] for row in rows] == [
        first.headers["X-Tasklease-Run-Id"],
        busy.headers["X-Tasklease-Run-Id"],
    ]
    assert rows[0][5] <= rows[1][4], "the two runs overlapped"


TASKS, KEYS, PROCESSES = 200, 10, 4


def test_tasks_over_ten_keys_on_four_processes_never_overlap_within_a_key(
    tmp_path: Path,
) -> None:
    outcomes: Counter[str] = Counter()

    def deliver(index: int) -> str:
        """Cloud Tasks' part: deliver until the worker takes the task (2xx)."""
        retry = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            response = requests.post(
                f"{server.url}/tasks/post_ledger",
                headers=task_headers(task=f"posting-{index}", retry=retry, execution=retry),
                json={"account_id": f"account-{index % KEYS}"},
                timeout=30,
            )
            outcome = response.headers["X-Tasklease-Outcome"]
            outcomes[outcome] += 1
            if response.status_code == 200:
                return outcome
            assert outcome == "key_busy", response.text
            retry += 1
            time.sleep(random.uniform(0.01, 0.05))  # The queue's backoff, shortened.
        raise AssertionError(f"posting-{index} never ran")

    started = time.monotonic()
    with (
        servers(tmp_path, 1, workers=PROCESSES) as running,
        ThreadPoolExecutor(4 * KEYS) as pool,
    ):
        [server] = running
        final = list(pool.map(deliver, range(TASKS)))
    elapsed = time.monotonic() - started
    assert final == ["processed"] * TASKS
    rows = intervals(tmp_path)
    executions = Counter(row[2] for row in rows)
    assert len(executions) == TASKS
    assert set(executions.values()) == {1}, "a task ran more than once"
    by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for _, key, _, _, start, end in rows:
        by_key[key].append((start, end))
    for key, spans in by_key.items():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, f"two tasks of {key} overlapped"
    pids = {row[3] for row in rows}
    print(  # The figures for the README: pytest -s shows them.
        f"\n{TASKS} tasks, {KEYS} keys, {len(pids)} processes: {elapsed:.1f} s, "
        f"{outcomes['key_busy']} key_busy answers, 0 overlaps, every task once"
    )


def deliver_until_processed(url: str, job: str, slot: str, seconds: float = 30) -> list[str]:
    """Cloud Scheduler's part for a retried run: deliver until 2xx; return every outcome."""
    outcomes = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        response = requests.post(f"{url}/jobs/{job}", headers=job_headers(job, slot), timeout=30)
        outcomes.append(response.headers["X-Tasklease-Outcome"])
        if response.status_code == 200:
            return outcomes
        time.sleep(0.25)
    raise AssertionError(f"{job} {slot} never ran: {Counter(outcomes)}")


def test_a_run_alive_past_max_runtime_keeps_the_job_while_its_lease_keeper_renews(
    tmp_path: Path,
) -> None:
    job, lock_name = "outlives_max_runtime", "job///outlives_max_runtime"
    store = SqliteStore(tmp_path / "runs.db")
    with servers(tmp_path, 1, workers=2) as [server], ThreadPoolExecutor(1) as pool:
        first = pool.submit(
            requests.post, f"{server.url}/jobs/{job}", headers=job_headers(job, SLOT_1), timeout=60
        )
        wait_until(lambda: started_count(tmp_path) == 1)
        taken = store.get_lock(lock_name)
        assert taken is not None
        # Past max_runtime (2 s) and past the lease it started with (6 s): still its job.
        refused = []
        while datetime.now(UTC) < taken.lease_expires + timedelta(seconds=2):
            response = requests.post(
                f"{server.url}/jobs/{job}", headers=job_headers(job, SLOT_2), timeout=30
            )
            refused.append(response.headers["X-Tasklease-Outcome"])
            time.sleep(0.25)
        lock = store.get_lock(lock_name)
        assert lock is not None
        assert set(refused) == {"in_progress"}
        assert lock.holder_attempt_id == taken.holder_attempt_id
        assert lock.lease_expires > taken.lease_expires + timedelta(seconds=2)  # Renewed.
        (tmp_path / "go").touch()
        assert first.result(timeout=30).headers["X-Tasklease-Outcome"] == "processed"
        assert deliver_until_processed(server.url, job, SLOT_2)[-1] == "processed"
    rows = sorted(intervals(tmp_path), key=lambda row: row[4])
    assert len(rows) == 2
    assert rows[0][5] <= rows[1][4], "the two runs overlapped"


def test_a_run_killed_holding_the_job_lets_the_next_run_start_only_after_max_runtime(
    tmp_path: Path,
) -> None:
    job, lock_name = "crashes_holding", "job///crashes_holding"
    store = SqliteStore(tmp_path / "runs.db")
    with servers(tmp_path, 1, workers=2) as [server], ThreadPoolExecutor(1) as pool:
        doomed = pool.submit(
            requests.post, f"{server.url}/jobs/{job}", headers=job_headers(job, SLOT_1), timeout=60
        )
        wait_until(lambda: started_count(tmp_path) == 1)
        crashed = store.get_lock(lock_name)
        assert crashed is not None
        pid = int((tmp_path / "started.log").read_text().split()[1])
        os.kill(pid, signal.SIGKILL)  # Mid-run: no finish, no release, no more renewals.
        assert doomed.exception(timeout=30) is not None
        (tmp_path / "go").touch()  # The successor, once it starts, need not wait.
        outcomes = deliver_until_processed(server.url, job, SLOT_2)
    successor = store.get_lock(lock_name)
    assert successor is not None
    assert successor.holder_run_id != crashed.holder_run_id
    # It waited out the dead holder's lease *and* its max_runtime (8 s from its start).
    assert successor.started_at >= crashed.safety_expires
    assert crashed.safety_expires - crashed.started_at == timedelta(seconds=8)
    assert outcomes[-1] == "processed"
    assert [row[1] for row in intervals(tmp_path)] == ["crashes_holding"]  # Only the successor.
