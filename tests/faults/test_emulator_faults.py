"""Scenarios 3 and 4, through the local Cloud Tasks emulator, whose retries matter here.

3. Lost responses: the worker answered, the emulator drops the answer and retries; every
   retry is answered from the run record without running the handler again.
4. An attempt outliving the dispatch deadline: the queue gives up on it and retries while the
   handler keeps running (and renewing its lease); the retries get 409 until it finishes, then
   the duplicate answer.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import requests

from tasklease.emulator import CloudTasksEmulator, DeliveryRecord, Faults
from tasklease.producer import Producer
from tasklease.worker.core.records import RunStatus
from tests.faults.downstream import Downstream
from tests.faults.harness import Backend, FaultServer, Tally, overlaps, scale, tally

pytestmark = pytest.mark.faults

QUEUE = "projects/p/locations/us-central1/queues/faults"


def _emulator(
    tmp_path: Path, faults: Faults, backend: Backend
) -> Iterator[tuple[CloudTasksEmulator, Producer]]:
    with CloudTasksEmulator(data_dir=tmp_path / "emulator", faults=faults) as emulator:
        emulator.create_queue(
            QUEUE,
            retryConfig={"minBackoff": "0.1s", "maxBackoff": "1s", "maxAttempts": -1},
            rateLimits={"maxConcurrentDispatches": 32},
        )
        # Threads for every concurrent dispatch: a request gunicorn accepted but has no thread
        # for would wait unanswered behind the long handlers.
        server = FaultServer(tmp_path, store=backend.url, workers=2, threads=32, env=backend.env)
        with server:
            producer = Producer("p", "us-central1", "faults", server.url,
                                tasks_endpoint=emulator.url)  # fmt: skip
            yield emulator, producer


def _by_task(deliveries: list[DeliveryRecord]) -> dict[str, list[DeliveryRecord]]:
    tasks: dict[str, list[DeliveryRecord]] = defaultdict(list)
    for delivery in sorted(deliveries, key=lambda d: (d.attempt, d.started_us)):
        tasks[delivery.name].append(delivery)
    return tasks


def _counts(
    keys: list[str], deliveries: list[DeliveryRecord], downstream: Downstream, backend: Backend
) -> Tally:
    outcomes = Counter(d.outcome for d in deliveries)
    counts = tally(keys, [], downstream, backend.records())
    counts.delivered = len(deliveries)
    counts.duplicates_absorbed = outcomes["duplicate"] + outcomes["in_progress"]
    return counts


def test_lost_responses_are_retried_and_answered_from_the_record(
    tmp_path: Path, backend_full: Backend, report: Callable[[str, Tally], None]
) -> None:
    backend = backend_full
    tasks = scale(150, 1000)
    keys = [f"lost-{n:05d}" for n in range(tasks)]
    faults = Faults(lost_response=0.3, duplicate=0.1, seed=7)
    for emulator, producer in _emulator(tmp_path, faults, backend):
        results = producer.enqueue_many("work", [(key, {"key": key}) for key in keys])
        assert all(r.created for r in results)
        emulator.join(timeout=scale(120, 600))
        deliveries = emulator.deliveries()
    downstream = Downstream(tmp_path / "downstream.db")
    counts = _counts(keys, deliveries, downstream, backend)
    faulted = Counter(d.fault for d in deliveries)
    # Every delivery made after a lost final answer of its task (the worker's outcome is
    # recorded even when its answer is lost). A lost 409 or 503 (the Spanner emulator aborts
    # concurrent transactions: a claim can run out of retries) asks for the retry that then
    # runs the task.
    final = {"processed", "duplicate"}
    after_loss = []
    for attempts in _by_task(deliveries).values():
        losses = [d.attempt for d in attempts if d.fault == "lost_response" and d.outcome in final]
        after_loss += [d for d in attempts if losses and d.attempt > min(losses)]
    counts.extra.update(
        lost_responses=faulted["lost_response"],
        injected_duplicates=faulted["duplicate"],
        store_unavailable_503=sum(d.outcome in ("unavailable", "unrecorded") for d in deliveries),
        retries_after_loss=len(after_loss),
        answered_from_record=sum(d.outcome == "duplicate" for d in after_loss),
    )
    report(f"lost_responses[{backend.name}]", counts)
    assert counts.lost == 0
    assert counts.executed == tasks
    assert faulted["lost_response"] > tasks // 10  # The faults did happen.
    # The worker's answer to each retry (recorded even when that answer was lost in turn).
    bad = [d for d in after_loss if d.outcome != "duplicate" or d.status not in (200, None)]
    assert after_loss and not bad, bad[:5]
    refused = counts.extra["store_unavailable_503"]
    assert counts.delivered == counts.executed + counts.duplicates_absorbed + refused


def test_an_attempt_outliving_the_dispatch_deadline_keeps_the_run_until_it_finishes(
    tmp_path: Path, report: Callable[[str, Tally], None]
) -> None:
    # 15 s is the shortest dispatch deadline Cloud Tasks allows; the handler takes 18 s,
    # checking its (2 s, renewed) lease every second.
    tasks = scale(3, 10)
    keys = [f"deadline-{n:03d}" for n in range(tasks)]
    backend = Backend("sqlite", f"sqlite:///{tmp_path}/runs.db")
    for emulator, producer in _emulator(tmp_path, Faults(), backend):
        producer.enqueue_many(
            "work",
            [(key, {"key": key, "sleep": 18, "steps": 18, "check": True}) for key in keys],
            dispatch_deadline=timedelta(seconds=15),
        )
        emulator.join(timeout=120)
        deliveries = emulator.deliveries()
    downstream = Downstream(tmp_path / "downstream.db")
    executions = downstream.executions()
    counts = _counts(keys, deliveries, downstream, backend)
    outcomes = Counter(d.outcome for d in deliveries)
    counts.extra.update(deadline_passed=sum(d.status is None for d in deliveries),
                        in_progress_409=outcomes["in_progress"])  # fmt: skip
    report("dispatch_deadline[sqlite]", counts)
    assert counts.lost == 0
    assert counts.executed == tasks
    assert overlaps(executions) == []
    for attempts in _by_task(deliveries).values():
        assert attempts[0].status is None  # The deadline passed: the queue gave up on it.
        middle = {(d.status, d.outcome) for d in attempts[1:-1]}
        assert middle == {(409, "in_progress")}
        assert (attempts[-1].status, attempts[-1].outcome) == (200, "duplicate")
    records = backend.records()
    assert {(r.status, r.attempts) for r in records.values()} == {(RunStatus.COMPLETED, 1)}


def test_a_fan_in_under_duplicates_and_lost_answers_joins_once_with_every_result(
    tmp_path: Path, backend_sql: Backend, report: Callable[[str, Tally], None]
) -> None:
    """100 children, 30% duplicated and 30% of answers lost: one then execution, 100 results."""
    from tasklease.plumbing.serve import free_port  # noqa: PLC0415

    backend = backend_sql
    children = 100
    port = free_port()
    faults = Faults(lost_response=0.3, duplicate=0.3, seed=11)
    with CloudTasksEmulator(data_dir=tmp_path / "emulator", faults=faults) as emulator:
        env = _retrying_queue(emulator, backend, port, dispatches=32)
        with FaultServer(tmp_path, store=backend.url, workers=2, threads=16, env=env, port=port):
            producer = Producer("p", "us-central1", "faults", f"http://127.0.0.1:{port}",
                                tasks_endpoint=emulator.url)  # fmt: skip
            producer.enqueue("fan_parent", {"count": children, "prefix": "fan"}, key="fan-1")
            emulator.join(timeout=180)
            deliveries = emulator.deliveries()
    lines = (tmp_path / "fan_in.jsonl").read_text().splitlines()
    executions = [json.loads(line) for line in lines]
    keys = [f"fan-{n:04d}" for n in range(children)]
    counts = _counts(keys, [d for d in deliveries if d.url.endswith("/work")], Downstream(
        tmp_path / "downstream.db"), backend)  # fmt: skip
    faulted = Counter(d.fault for d in deliveries)
    counts.extra.update(
        then_executions=len(executions),
        injected_duplicates=faulted["duplicate"],
        lost_responses=faulted["lost_response"],
    )
    report(f"fan_in[{backend.name}]", counts)
    assert faulted["duplicate"] > 10 and faulted["lost_response"] > 10  # The faults happened.
    assert counts.lost == 0
    assert counts.executed == children
    (execution,) = executions
    payload = execution["payload"]
    assert payload["summary"] == {"total": children, "completed": children, "failed": 0}
    assert [r["key"] for r in payload["results"]] == keys
    assert all(r["status"] == "completed" for r in payload["results"])


def test_waits_under_duplicates_and_lost_answers_resume_once_with_the_first_signal(
    tmp_path: Path, backend_sql: Backend, report: Callable[[str, Tally], None]
) -> None:
    """30 runs wait; each is signalled twice over the worker's HTTP route while 30% of the
    deliveries are duplicated and 30% of the answers lost: each asks once and acts once, on
    its first signal's payload."""
    from tasklease.plumbing.serve import free_port  # noqa: PLC0415

    backend = backend_sql
    runs, port = 30, free_port()
    faults = Faults(lost_response=0.3, duplicate=0.3, seed=13)
    with CloudTasksEmulator(data_dir=tmp_path / "emulator", faults=faults) as emulator:
        env = _retrying_queue(emulator, backend, port, dispatches=16)
        with FaultServer(tmp_path, store=backend.url, workers=2, threads=8, env=env, port=port):
            producer = Producer("p", "us-central1", "faults", f"http://127.0.0.1:{port}",
                                tasks_endpoint=emulator.url)  # fmt: skip
            for n in range(runs):
                producer.enqueue("wait_work", {"key": f"w-{n:02d}"}, key=f"w-{n:02d}")
            # Every run waits (its task answered 200); its timeout task stays queued, an hour out.
            waiting = _runs_in(backend, RunStatus.WAITING, runs, timeout=120)
            keys = {}
            for line in (tmp_path / "waits.jsonl").read_text().splitlines():
                note = json.loads(line)
                keys[note["run"]] = note["key"]
            for run_id in sorted(waiting):
                url = f"http://127.0.0.1:{port}/signals/{run_id}/go"
                first = requests.post(url, json={"key": keys[run_id]}, timeout=30)
                assert first.status_code == 200 and first.json()["accepted"], first.text
                # Sent again: a duplicate while the run waits still, refused once it ended.
                again = requests.post(url, json={"key": "a second, ignored"}, timeout=30)
                assert again.json()["outcome"] in ("duplicate", "ended"), again.text
            _runs_in(backend, RunStatus.COMPLETED, runs, timeout=180)
            time.sleep(2)  # Duplicates the emulator still holds in flight are answered too.
            deliveries = emulator.deliveries()
    notes = [json.loads(line) for line in (tmp_path / "waits.jsonl").read_text().splitlines()]
    phases = Counter((note["key"], note["phase"]) for note in notes)
    faulted = Counter(d.fault for d in deliveries)
    acted_keys = {note["key"] for note in notes if note["phase"] == "acted"}
    counts = Tally(
        delivered=len(deliveries),
        executed=phases_total(phases, "acted"),
        duplicates_absorbed=faulted["duplicate"],
        lost=runs - len(acted_keys),
    )
    counts.extra.update(
        runs=runs,
        asked=phases_total(phases, "asked"),
        injected_duplicates=faulted["duplicate"],
        lost_responses=faulted["lost_response"],
    )
    report(f"waits[{backend.name}]", counts)
    assert faulted["duplicate"] > 5 and faulted["lost_response"] > 5  # The faults happened.
    assert all(phases[(f"w-{n:02d}", "asked")] == 1 for n in range(runs)), phases
    assert all(phases[(f"w-{n:02d}", "acted")] == 1 for n in range(runs)), phases
    acted = {note["key"]: note["value"] for note in notes if note["phase"] == "acted"}
    assert acted == {f"w-{n:02d}": {"key": f"w-{n:02d}"} for n in range(runs)}
    records = [r for r in backend.records().values() if r.handler == "wait_work"]
    assert {r.status for r in records} == {RunStatus.COMPLETED}


def phases_total(phases: Counter[tuple[str, str]], phase: str) -> int:
    """How many notes of ``phase`` the waiting runs wrote, over every run."""
    return sum(n for (_, noted), n in phases.items() if noted == phase)


def _runs_in(backend: Backend, status: RunStatus, count: int, *, timeout: float) -> set[str]:
    """The ids of the ``wait_work`` runs once ``count`` of them are in ``status``."""
    deadline = time.monotonic() + timeout
    while True:
        found = {
            r.run_id
            for r in backend.records().values()
            if r.handler == "wait_work" and r.status is status
        }
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(found)} of {count} runs {status.value} after {timeout} s")
        time.sleep(0.5)


def _retrying_queue(
    emulator: CloudTasksEmulator, backend: Backend, port: int, *, dispatches: int
) -> dict[str, str]:
    """Create the faults queue on ``emulator``, retrying without end on a short backoff, and
    return the environment of a worker on ``port`` that enqueues into it."""
    emulator.create_queue(
        QUEUE,
        retryConfig={"minBackoff": "0.1s", "maxBackoff": "1s", "maxAttempts": -1},
        rateLimits={"maxConcurrentDispatches": dispatches},
    )
    return {
        **backend.env,
        "TASKLEASE_PROJECT": "p",
        "TASKLEASE_LOCATION": "us-central1",
        "TASKLEASE_QUEUE": "faults",
        "TASKLEASE_WORKER_URL": f"http://127.0.0.1:{port}",
        "TASKLEASE_TASKS_ENDPOINT": emulator.url,
    }
