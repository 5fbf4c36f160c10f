"""Every ``gcloud tasks`` command a developer reaches for, against the emulator."""

from __future__ import annotations

from tasklease.emulator import CloudTasksEmulator
from tasklease.worker.auth.authenticators import AuthRequest, OidcAuth
from tasklease.worker.core.identity import Kind
from tasklease.worker.handlers.router import HandlerSpec
from tests.conformance.conftest import LOCATION, PROJECT, Gcloud
from tests.support.emulator_target import Target

WHERE = f"--location={LOCATION}"
PARENT = f"projects/{PROJECT}/locations/{LOCATION}"
SA = "tasks@test-project.iam.gserviceaccount.com"


def test_queue_commands(gcloud: Gcloud) -> None:
    created = gcloud("tasks", "queues", "create", "q1", WHERE, "--max-attempts=7")
    assert created["name"] == f"{PARENT}/queues/q1"
    assert created["retryConfig"]["maxAttempts"] == 7
    # No --location: gcloud asks App Engine and ListLocations for the default location.
    assert f"{PARENT}/queues/q1" in [q["name"] for q in gcloud("tasks", "queues", "list")]
    updated = gcloud(
        "tasks", "queues", "update", "q1", WHERE, "--max-dispatches-per-second=20",
        "--min-backoff=2s",
    )  # fmt: skip
    assert updated["rateLimits"]["maxDispatchesPerSecond"] == 20
    assert updated["retryConfig"]["minBackoff"] == "2s"
    assert updated["retryConfig"]["maxAttempts"] == 7  # Untouched.
    assert (
        gcloud("tasks", "queues", "describe", "q1", WHERE)["rateLimits"]["maxDispatchesPerSecond"]
        == 20
    )
    gcloud("tasks", "queues", "pause", "q1", WHERE)
    assert gcloud("tasks", "queues", "describe", "q1", WHERE)["state"] == "PAUSED"
    paused = gcloud("tasks", "queues", "list", WHERE, "--filter=state:PAUSED")
    assert [q["name"] for q in paused] == [f"{PARENT}/queues/q1"]
    gcloud("tasks", "queues", "resume", "q1", WHERE)
    assert gcloud("tasks", "queues", "describe", "q1", WHERE)["state"] == "RUNNING"
    gcloud("tasks", "queues", "purge", "q1", WHERE)
    assert "purgeTime" in gcloud("tasks", "queues", "describe", "q1", WHERE)
    gcloud("tasks", "queues", "delete", "q1", WHERE)
    assert "NOT_FOUND" in gcloud.fails("tasks", "queues", "describe", "q1", WHERE)
    assert "existed too recently" in gcloud.fails("tasks", "queues", "create", "q1", WHERE)


def test_queue_iam_policy_commands(gcloud: Gcloud) -> None:
    gcloud("tasks", "queues", "create", "guarded", WHERE)
    assert "bindings" not in gcloud("tasks", "queues", "get-iam-policy", "guarded", WHERE)
    member = f"serviceAccount:{SA}"
    gcloud(
        "tasks", "queues", "add-iam-policy-binding", "guarded", WHERE, f"--member={member}",
        "--role=roles/cloudtasks.enqueuer",
    )  # fmt: skip
    policy = gcloud("tasks", "queues", "get-iam-policy", "guarded", WHERE)
    assert policy["bindings"] == [{"members": [member], "role": "roles/cloudtasks.enqueuer"}]


def test_location_ids_that_are_not_regions_are_refused(gcloud: Gcloud) -> None:
    error = gcloud.fails("tasks", "queues", "create", "q", "--location=moon1")
    assert "INVALID_ARGUMENT" in error and "not a Cloud region" in error


def test_http_task_commands_deliver_with_an_oidc_token(
    gcloud: Gcloud, conformance_emulator: CloudTasksEmulator, target: tuple[Target, str]
) -> None:
    recorder, url = target
    gcloud("tasks", "queues", "create", "work", WHERE)
    gcloud("tasks", "queues", "pause", "work", WHERE)
    task = gcloud(
        "tasks", "create-http-task", "t1", "--queue=work", WHERE, f"--url={url}",
        "--method=PUT", "--header=Content-Type:application/json", '--body-content={"n": 1}',
        f"--oidc-service-account-email={SA}",
    )  # fmt: skip
    assert task["name"] == f"{PARENT}/queues/work/tasks/t1"
    assert task["httpRequest"]["httpMethod"] == "PUT"
    error = gcloud.fails("tasks", "create-http-task", "t1", "--queue=work", WHERE, f"--url={url}")
    assert "ALREADY_EXISTS" in error
    gcloud("tasks", "create-http-task", "t2", "--queue=work", WHERE, f"--url={url}")
    assert [
        t["name"].rsplit("/", 1)[1] for t in gcloud("tasks", "list", "--queue=work", WHERE)
    ] == [
        "t1",
        "t2",
    ]
    assert gcloud("tasks", "describe", "t1", "--queue=work", WHERE)["dispatchCount"] == 0
    gcloud("tasks", "delete", "t2", "--queue=work", WHERE)
    gcloud("tasks", "run", "t1", "--queue=work", WHERE)  # Paused queue: RunTask still sends.
    conformance_emulator.join(f"{PARENT}/queues/work", timeout=10)
    [hit] = recorder.hits
    assert hit.body == b'{"n": 1}'
    assert hit.headers["Content-Type"] == "application/json"
    assert hit.headers["X-Cloudtasks-Taskname"] == "t1"
    auth = OidcAuth([SA], audience=url, certs_url=conformance_emulator.certs_url)
    spec = HandlerSpec(Kind.TASK, "hit", lambda p, c: None)
    result = auth.authenticate(AuthRequest(hit.headers["Authorization"], url), spec)
    assert (result.status, result.principal) == (200, SA)
    assert "existed recently" in gcloud.fails("tasks", "describe", "t1", "--queue=work", WHERE)


def test_location_commands(gcloud: Gcloud) -> None:
    listed = [location["locationId"] for location in gcloud("tasks", "locations", "list")]
    assert listed[0] == LOCATION and "europe-west1" in listed
    assert gcloud("tasks", "locations", "describe", LOCATION)["name"] == (
        f"projects/{PROJECT}/locations/{LOCATION}"
    )
