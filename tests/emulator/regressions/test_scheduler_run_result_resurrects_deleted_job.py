"""A Scheduler run's result recorded while its job was deleted brought the job back (a read,
then a write of the whole job), and an update racing it was lost: every job change is one
read-modify-write in one transaction now."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator.scheduler_api import SchedulerApi

PARENT = "projects/p/locations/us-central1"
ROUNDS = 300


@pytest.fixture
def api(tmp_path: Path) -> Iterator[SchedulerApi]:
    with CloudTasksEmulator(data_dir=tmp_path, scheduler_on_schedule=False) as emulator:
        yield emulator.scheduler_api


def job(name: str) -> dict[str, object]:
    return {
        "name": f"{PARENT}/jobs/{name}",
        "schedule": "0 3 * * *",
        "timeZone": "Etc/UTC",
        "httpTarget": {"uri": "http://127.0.0.1:9/x", "httpMethod": "POST"},
    }


def test_a_run_result_recorded_while_the_job_is_deleted_never_brings_it_back(
    api: SchedulerApi,
) -> None:
    resurrected = 0
    for index in range(ROUNDS):
        name = f"{PARENT}/jobs/j{index}"
        api.create_job(PARENT, job(f"j{index}"))
        start = threading.Barrier(2)

        def record(name: str = name, start: threading.Barrier = start) -> None:
            start.wait()
            api._record_run(name, 1_792_152_000_000_000, 500)

        recorder = threading.Thread(target=record)
        recorder.start()
        start.wait()
        api.delete_job(name)
        recorder.join()
        resurrected += _exists(api, name)
    assert resurrected == 0


def test_an_update_racing_a_run_result_is_kept(api: SchedulerApi) -> None:
    name = f"{PARENT}/jobs/j"
    api.create_job(PARENT, job("j"))
    lost = 0
    for index in range(ROUNDS):
        description = f"update {index}"
        start = threading.Barrier(2)

        def record(start: threading.Barrier = start, at: int = index) -> None:
            start.wait()
            api._record_run(name, 1_792_152_000_000_000 + at, 500)

        recorder = threading.Thread(target=record)
        recorder.start()
        start.wait()
        api.update_job(name, {"description": description}, "description")
        recorder.join()
        lost += api.get_job(name).get("description") != description
    assert lost == 0


def _exists(api: SchedulerApi, name: str) -> bool:
    try:
        api.get_job(name)
    except Exception:
        return False
    return True
