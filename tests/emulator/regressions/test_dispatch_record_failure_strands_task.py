"""Finding: when recording the attempts that ended on the dispatcher's own thread fails
(Dispatcher._conclude -> EmulatorDB.finish_attempts raises, e.g. a transient "database is
locked" or disk error), the error is logged as "failed to record attempts; retrying" but nothing
retries: the results are dropped and the tasks stay in_flight=1 in the database, so they are
never dispatched again (until the emulator restarts). The pool path (_dispatch) still falls
back to rescheduling the task in a second, as the old code did for every attempt."""

from __future__ import annotations

import base64

import pytest

from tasklease.emulator import CloudTasksEmulator
from tests.support.emulator_faults import fail_attempt_records
from tests.support.emulator_target import Target

QUEUE = "projects/p/locations/us-central1/queues/q"


def test_a_failed_record_of_an_attempt_does_not_strand_its_task(
    target: tuple[Target, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder, url = target
    with CloudTasksEmulator() as emulator:
        failures = fail_attempt_records(emulator, monkeypatch, times=1)  # The first, once.
        emulator.create_queue(QUEUE)
        task = {
            "name": f"{QUEUE}/tasks/stranded",
            "httpRequest": {"url": url, "body": base64.b64encode(b"{}").decode()},
        }
        emulator.api.create_task(QUEUE, {"task": task})
        try:
            emulator.join(timeout=20)  # Retried within seconds, then deleted on its 200.
        finally:
            left = emulator.db.get_task(f"{QUEUE}/tasks/stranded")
        assert failures == [1]
        assert left is None, f"task left in flight={left.in_flight if left else None}"
        assert len(recorder.hits) >= 1
