"""Google's Node clients, ``@google-cloud/tasks`` and ``@google-cloud/scheduler`` (versions in
package.json), against the emulator over gRPC (their default) and the REST fallback
(``fallback: true``). ``node_driver.mjs`` runs each scenario once per transport and prints
every call's answer; each test compares answers with Google's documentation, cited in its
docstring (the v2 / v1 RPC references at cloud.google.com/tasks/docs/reference/rpc and
cloud.google.com/scheduler/docs/reference/rpc, whose text the clients' own type docs repeat).
Everything runs on 127.0.0.1. Without node or the npm packages (``npm ci``) the tests skip,
loudly; in CI (``CI=true``) they fail instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator.api import (
    QUEUE_GONE,
    QUEUE_MISSING,
    TASK_EXISTS,
    TASK_GONE,
    TASK_TOO_RECENT,
)

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
DRIVER = HERE / "node_driver.mjs"
PACKAGES = ("@google-cloud/tasks", "@google-cloud/scheduler", "google-gax", "google-auth-library")
PARENT = "projects/node-project/locations/us-central1"
TARGET = "http://127.0.0.1:9/t"  # Nothing listens: no call here needs the target to answer.
# gRPC status codes (google.rpc.Code).
NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION = 5, 6, 9


def _require_node() -> None:
    missing = [p for p in PACKAGES if not (ROOT / "node_modules" / p / "package.json").exists()]
    if shutil.which("node") and not missing:
        return
    message = (
        "node or the npm packages are missing: the Node client conformance tests of the "
        f"emulator did NOT run (missing: {missing or ['node']}; run `npm ci`)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def emulator() -> Iterator[CloudTasksEmulator]:
    _require_node()
    with CloudTasksEmulator() as running:  # 127.0.0.1, free ports.
        yield running


def _run(emulator: CloudTasksEmulator, scenario: str, transport: str) -> dict[str, Any]:
    rest_port = emulator.url.rsplit(":", 1)[1]
    done = subprocess.run(
        ["node", str(DRIVER), scenario, transport, rest_port, str(emulator.grpc_port), TARGET],
        cwd=ROOT,
        # No look-up of Google's metadata server: every call stays on 127.0.0.1.
        env={**os.environ, "METADATA_SERVER_DETECTION": "none"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"node_driver.mjs {scenario} {transport} failed:\n{done.stderr}"
    results: dict[str, Any] = json.loads(done.stdout)
    return results


@pytest.fixture(scope="module", params=["grpc", "rest"])
def tasks(emulator: CloudTasksEmulator, request: pytest.FixtureRequest) -> dict[str, Any]:
    return _run(emulator, "tasks", request.param) | {"transport": request.param}


@pytest.fixture(scope="module", params=["grpc", "rest"])
def scheduler(emulator: CloudTasksEmulator, request: pytest.FixtureRequest) -> dict[str, Any]:
    return _run(emulator, "scheduler", request.param) | {"transport": request.param}


def ok(results: dict[str, Any], step: str) -> Any:
    assert "ok" in results[step], f"{step} failed: {results[step]}"
    return results[step]["ok"]


def error(results: dict[str, Any], step: str) -> tuple[int, str]:
    assert "error" in results[step], f"{step} succeeded: {results[step]}"
    return results[step]["error"]["code"], results[step]["error"]["message"]


def queue_of(results: dict[str, Any]) -> str:
    return f"{PARENT}/queues/node-{results['transport']}"


# Cloud Tasks.
def test_get_location_names_the_region(tasks: dict[str, Any]) -> None:
    """google.cloud.location.Locations.GetLocation: "Gets information about a location"; the
    location ID of ``projects/P/locations/us-central1`` is ``us-central1``."""
    assert ok(tasks, "getLocation") == "us-central1"


def test_a_created_queue_has_googles_defaults(tasks: dict[str, Any]) -> None:
    """Queue and RetryConfig (v2): a new queue is RUNNING; "If unspecified when the queue is
    created, Cloud Tasks will pick the default": max_attempts 100, min_backoff 0.1 s,
    max_backoff 3600 s, max_dispatches_per_second 500 (cloud.google.com/tasks/docs/configuring-
    queues and the RetryConfig/RateLimits field docs)."""
    for step in ("createQueue", "getQueue"):
        queue = ok(tasks, step)
        assert queue["name"] == queue_of(tasks)
        assert queue["state"] == "RUNNING"
        assert queue["maxAttempts"] == 100
        assert queue["minBackoff"] == pytest.approx(0.1)
        assert queue["maxBackoff"] == 3600
        assert queue["maxDispatchesPerSecond"] == 500
    assert queue_of(tasks) in ok(tasks, "listQueues")


def test_a_taken_queue_name_is_already_exists_and_a_missing_queue_not_found(
    tasks: dict[str, Any],
) -> None:
    """CreateQueue of a name that exists answers ALREADY_EXISTS (google.rpc.Code 6; AIP-133,
    "Create" errors); GetQueue of a queue that does not exist answers NOT_FOUND (5; AIP-131)."""
    assert error(tasks, "createQueueAgain")[0] == ALREADY_EXISTS
    assert error(tasks, "getMissingQueue")[0] == NOT_FOUND


def test_update_queue_creates_a_missing_queue(tasks: dict[str, Any]) -> None:
    """UpdateQueue: "This method creates the queue if it does not exist and updates the queue
    if it does exist"; fields outside update_mask keep their defaults."""
    queue = ok(tasks, "updateMissingQueue")
    assert queue["name"] == queue_of(tasks) + "-upserted"
    assert queue["maxAttempts"] == 7
    assert queue["state"] == "RUNNING"
    assert queue["maxBackoff"] == 3600


def test_pause_queue_answers_the_paused_queue(tasks: dict[str, Any]) -> None:
    """PauseQueue: "If a queue is paused then the system will stop dispatching tasks until the
    queue is resumed"; it returns the queue, whose state is PAUSED."""
    assert ok(tasks, "pauseQueue")["state"] == "PAUSED"


def test_create_task_answers_the_basic_view_with_googles_truncation(tasks: dict[str, Any]) -> None:
    """CreateTaskRequest.response_view: "By default response_view is BASIC; not all information
    is retrieved by default because some data, such as payloads, might be desirable to return
    only when needed"; Task.create_time "will be truncated to the nearest second";
    dispatch_deadline "will be truncated to the nearest millisecond", default 10 minutes for
    HTTP tasks; HttpRequest.http_method: "The HTTP method to use for the request. The default
    is POST"."""
    task = ok(tasks, "createTask")
    assert task["name"] == f"{queue_of(tasks)}/tasks/first"
    assert task["view"] == "BASIC"
    assert task["body"] == ""
    assert task["httpMethod"] == "POST"
    assert task["dispatchDeadline"] == pytest.approx(20.123)
    assert task["createTimeNanos"] == 0
    unnamed = ok(tasks, "createUnnamedTask")
    assert unnamed["name"].startswith(f"{queue_of(tasks)}/tasks/")
    assert unnamed["dispatchDeadline"] == 600


def test_task_names_are_de_duplicated(tasks: dict[str, Any]) -> None:
    """CreateTaskRequest.task, "Task De-duplication": "If a task's ID is identical to that of
    an existing task or a task that was deleted or executed recently then the call will fail
    with ALREADY_EXISTS"; production words the second case "The task cannot be created because
    a task with this name existed too recently"."""
    assert error(tasks, "createTaskAgain") == (ALREADY_EXISTS, TASK_EXISTS)
    assert error(tasks, "createDeletedName") == (ALREADY_EXISTS, TASK_TOO_RECENT)


def test_create_task_in_a_missing_or_deleted_queue_is_a_failed_precondition(
    tasks: dict[str, Any],
) -> None:
    """CreateTaskRequest.parent: "The queue must already exist." Production answers
    FAILED_PRECONDITION (9), "Queue does not exist." or, for a queue deleted recently, "The
    queue no longer exists, though a queue with this name existed recently."."""
    assert error(tasks, "createTaskInMissingQueue") == (FAILED_PRECONDITION, QUEUE_MISSING)
    assert error(tasks, "createTaskInDeletedQueue") == (FAILED_PRECONDITION, QUEUE_GONE)
    assert ok(tasks, "deleteQueue") == "deleted"


def test_get_task_in_the_full_view_carries_the_body(tasks: dict[str, Any]) -> None:
    """GetTaskRequest.response_view FULL returns the whole task, payload included."""
    task = ok(tasks, "getTaskFull")
    assert task["view"] == "FULL"
    assert task["body"] == '{"n": 1}'
    assert task["dispatchDeadline"] == pytest.approx(20.123)


def test_list_tasks_lists_the_queues_tasks_and_takes_a_large_page_size(
    tasks: dict[str, Any],
) -> None:
    """ListTasks: "The maximum page size is 1000. If unspecified, the page size will be the
    maximum"; a larger page size is coerced to the maximum (AIP-158), not refused."""
    names = ok(tasks, "listTasks")
    assert f"{queue_of(tasks)}/tasks/first" in names
    assert len(names) == 2
    assert ok(tasks, "listTasksTooLarge") == 2


def test_run_task_answers_the_task(tasks: dict[str, Any]) -> None:
    """RunTask: "Forces a task to run now. When this method is called, Cloud Tasks will
    dispatch the task, even if the task is already running, the queue has reached its
    RateLimits or is PAUSED"; it returns the Task, in the BASIC view by default
    (RunTaskRequest.response_view)."""
    task = ok(tasks, "runTask")
    assert task["name"] == f"{queue_of(tasks)}/tasks/first"
    assert task["view"] == "BASIC"


def test_a_deleted_task_is_not_found_with_googles_message(tasks: dict[str, Any]) -> None:
    """DeleteTask deletes a scheduled task; a later GetTask answers NOT_FOUND, in production's
    words for a task that existed recently."""
    assert ok(tasks, "deleteTask") == "deleted"
    assert error(tasks, "getDeletedTask") == (NOT_FOUND, TASK_GONE)


def test_the_node_v2_client_has_no_batch_create_tasks(tasks: dict[str, Any]) -> None:
    """BatchCreateTasks is in the v2 API of google-cloud-tasks 2.26 (Python) but only in the
    v2beta3 client of @google-cloud/tasks: its v2 client has no such method, so the Node suite
    cannot call it (tests/emulator/regressions/test_batch_create_tasks.py drives it from Python)."""
    assert ok(tasks, "batchCreateTasks") == "undefined"


# Cloud Scheduler.
def job_of(results: dict[str, Any]) -> str:
    return f"{PARENT}/jobs/node-{results['transport']}"


def test_a_created_job_is_enabled_with_googles_defaults(scheduler: dict[str, Any]) -> None:
    """Job (v1): state ENABLED after CreateJob (ENABLED: "The job is executing normally");
    attempt_deadline: "For HTTP targets, the default is 3 minutes"; RetryConfig.retry_count:
    "The default value of retry_count is zero"."""
    for step in ("createJob", "getJob"):
        job = ok(scheduler, step)
        assert job["name"] == job_of(scheduler)
        assert job["state"] == "ENABLED"
        assert job["schedule"] == "0 3 * * *"
        assert job["timeZone"] == "Etc/UTC"
        assert job["uri"] == TARGET
        assert job["attemptDeadline"] == 180
        assert job["retryCount"] == 0
    assert ok(scheduler, "listJobs") == [job_of(scheduler)]


def test_a_taken_job_name_is_already_exists(scheduler: dict[str, Any]) -> None:
    """CreateJob of a name that exists: ALREADY_EXISTS (AIP-133)."""
    assert error(scheduler, "createJobAgain")[0] == ALREADY_EXISTS


def test_update_job_changes_the_masked_fields(scheduler: dict[str, Any]) -> None:
    """UpdateJob: "If successful, the updated Job is returned"; update_mask: "A mask used to
    specify which fields of the job are being updated"."""
    job = ok(scheduler, "updateJob")
    assert job["schedule"] == "30 4 * * *"
    assert job["uri"] == TARGET


def test_pause_resume_and_run_answer_the_job(scheduler: dict[str, Any]) -> None:
    """PauseJob: "If a job is paused then the system will stop executing the job until it is
    re-enabled via ResumeJob"; the job's state is PAUSED, then ENABLED again. RunJob: "Forces a
    job to run now", answering the Job."""
    assert ok(scheduler, "pauseJob")["state"] == "PAUSED"
    assert ok(scheduler, "resumeJob")["state"] == "ENABLED"
    assert ok(scheduler, "runJob")["name"] == job_of(scheduler)


def test_a_deleted_job_is_not_found(scheduler: dict[str, Any]) -> None:
    """DeleteJob deletes the job; a later GetJob answers NOT_FOUND."""
    assert ok(scheduler, "deleteJob") == "deleted"
    assert error(scheduler, "getDeletedJob")[0] == NOT_FOUND
