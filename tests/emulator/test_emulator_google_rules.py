"""What Cloud Tasks and Cloud Scheduler refuse, ignore, set and follow, through Google's own
Python clients against the emulator. The rules are those of the installed clients' docs
(google-cloud-tasks ``tasks_v2/types/target.py``: HttpRequest.url, .headers, .body;
google-cloud-scheduler ``scheduler_v1/types/target.py`` and ``job.py``: HttpTarget.headers,
Job.description, Job.time_zone, PauseJob and ResumeJob) and google.rpc's HTTP mapping."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.api_core import exceptions as api
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import scheduler_v1, tasks_v2
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response
from werkzeug.serving import make_server

from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator.errors import HTTP_OF_STATUS, ApiError
from tasklease.worker import Router, create_app
from tasklease.worker.stores import MemoryStore

PARENT = "projects/p/locations/us-central1"
QUEUE = f"{PARENT}/queues/q"
JOB = f"{PARENT}/jobs/j"


@pytest.fixture
def paths(_target_server: HTTPServer) -> Iterator[tuple[HTTPServer, list[tuple[str, Request]]]]:
    """Paths /ok (200), /moved (302 to /ok), /kept (307 to /ok), /tls (302 to https)."""
    hits: list[tuple[str, Request]] = []

    def answer(path: str, response: Response):  # type: ignore[no-untyped-def]
        def handle(request: Request) -> Response:
            request.get_data()
            hits.append((path, request))
            return response

        return handle

    _target_server.clear()
    ok = _target_server.url_for("/ok")
    for path, response in (
        ("/ok", Response("ok")),
        ("/moved", Response("", status=302, headers={"Location": "/ok"})),
        ("/kept", Response("", status=307, headers={"Location": ok})),
        ("/tls", Response("", status=302, headers={"Location": ok.replace("http", "https")})),
    ):
        _target_server.expect_request(path).respond_with_handler(answer(path, response))
    yield _target_server, hits
    _target_server.clear()


@pytest.fixture(params=["rest", "grpc"])
def tasks(emulator: CloudTasksEmulator, request: pytest.FixtureRequest) -> Any:
    client = emulator.client(request.param)
    client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    return client


@pytest.fixture
def jobs(emulator: CloudTasksEmulator) -> scheduler_v1.CloudSchedulerClient:
    return scheduler_v1.CloudSchedulerClient(
        transport="rest",
        client_options=ClientOptions(api_endpoint=emulator.url),
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
    )


def http_task(url: str, **fields: Any) -> tasks_v2.Task:
    return tasks_v2.Task(http_request=tasks_v2.HttpRequest(url=url, **fields))


def http_job(url: str, **fields: Any) -> scheduler_v1.Job:
    target = fields.pop("target", {})
    return scheduler_v1.Job(
        name=JOB, schedule=fields.pop("schedule", "0 3 * * *"),
        http_target=scheduler_v1.HttpTarget(uri=url, **target), **fields,
    )  # fmt: skip


def wait_for(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert condition()


# Item: every status answers over REST with google.rpc's HTTP code.
def test_every_status_has_the_http_code_google_api_core_gives_it() -> None:
    for status, code in HTTP_OF_STATUS.items():
        if status == "OK":
            continue
        expected = api.exception_class_for_grpc_status(grpc.StatusCode[status]).code
        # api_core gives UNKNOWN and DATA_LOSS no HTTP code; code.proto maps both to 500.
        assert code == (expected or 500), status
        assert ApiError(412 if status == "FAILED_PRECONDITION" else code, "x", status).code == code


def test_failed_precondition_over_rest_is_bad_request_as_from_google(
    emulator: CloudTasksEmulator,
) -> None:
    client = emulator.client("rest")
    client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    client.delete_queue(name=QUEUE)
    with pytest.raises(api.BadRequest, match="existed too recently") as raised:
        client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    assert not isinstance(raised.value, api.PreconditionFailed)


# Requests Google refuses.
@pytest.mark.parametrize(
    "fields",
    [
        {"http_method": tasks_v2.HttpMethod.GET, "body": b"x"},
        {"http_method": tasks_v2.HttpMethod.DELETE, "body": b"x"},
        {"headers": {"X-Big": "v" * (80 * 1024)}},
        {"headers": {"X-Line": "a\nb"}},
        {"headers": {"Bad Name": "v"}},
    ],
    ids=["get-body", "delete-body", "80kb-headers", "line-break", "bad-name"],
)
def test_create_task_refuses_what_cloud_tasks_refuses(tasks: Any, fields: dict[str, Any]) -> None:
    with pytest.raises(api.BadRequest):
        tasks.create_task(parent=QUEUE, task=http_task("http://127.0.0.1:9/x", **fields))


def test_a_url_is_at_most_2083_characters(tasks: Any) -> None:
    base = "http://127.0.0.1:9/"
    tasks.create_task(parent=QUEUE, task=http_task(base + "a" * (2083 - len(base))))
    with pytest.raises(api.BadRequest, match="2083"):
        tasks.create_task(parent=QUEUE, task=http_task(base + "a" * (2084 - len(base))))


def test_an_oauth_token_the_emulator_cannot_mint_is_refused_not_dropped(tasks: Any) -> None:
    token = tasks_v2.OAuthToken(service_account_email="a@p.iam.gserviceaccount.com")
    with pytest.raises(api.MethodNotImplemented, match="OAuth"):
        tasks.create_task(parent=QUEUE, task=http_task("http://127.0.0.1:9/x", oauth_token=token))


def test_a_sampling_ratio_above_one_is_refused(tasks: Any) -> None:
    queue = tasks_v2.Queue(
        name=f"{PARENT}/queues/logged",
        stackdriver_logging_config=tasks_v2.StackdriverLoggingConfig(sampling_ratio=2.0),
    )
    with pytest.raises(api.BadRequest, match="samplingRatio"):
        tasks.create_queue(parent=PARENT, queue=queue)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"target": {"http_method": scheduler_v1.HttpMethod.GET, "body": b"x"}}, "body"),
        ({"target": {"http_method": scheduler_v1.HttpMethod.DELETE, "body": b"x"}}, "body"),
        ({"description": "d" * 501}, "500"),
        ({"target": {"headers": {"X-Big": "v" * (80 * 1024)}}}, "80KB"),
        ({"schedule": "every 5 seconds"}, "schedule"),
    ],
)
def test_create_job_refuses_what_cloud_scheduler_refuses(
    jobs: scheduler_v1.CloudSchedulerClient, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(api.BadRequest, match=message):
        jobs.create_job(parent=PARENT, job=http_job("http://127.0.0.1:9/x", **fields))


def test_a_job_url_is_at_most_2083_characters(jobs: scheduler_v1.CloudSchedulerClient) -> None:
    with pytest.raises(api.BadRequest, match="2083"):
        jobs.create_job(parent=PARENT, job=http_job("http://127.0.0.1:9/" + "a" * 2070))


# Requests Google accepts.
@pytest.mark.parametrize(
    "schedule",
    [
        "every 5 minutes",
        "every 2 hours from 10:00 to 14:00",
        "every 30 mins synchronized",
        "every monday 09:00",
        "2nd,third mon,wed,thu of march 17:00",
        "1st monday of sep,oct,nov 17:00",
        "1 of jan,april,july,oct 00:00",
    ],
)
def test_english_like_schedules_and_utc_are_accepted(
    jobs: scheduler_v1.CloudSchedulerClient, schedule: str
) -> None:
    job = jobs.create_job(
        parent=PARENT, job=http_job("http://127.0.0.1:9/x", schedule=schedule, time_zone="utc")
    )
    assert job.schedule == schedule and job.time_zone == "utc"
    assert job.schedule_time.timestamp() > time.time()


# State checks.
def test_pausing_a_paused_job_and_resuming_an_enabled_one_fail_their_precondition(
    jobs: scheduler_v1.CloudSchedulerClient,
) -> None:
    jobs.create_job(parent=PARENT, job=http_job("http://127.0.0.1:9/x"))
    with pytest.raises(api.BadRequest, match="must be PAUSED"):
        jobs.resume_job(name=JOB)
    jobs.pause_job(name=JOB)
    with pytest.raises(api.BadRequest, match="must be ENABLED"):
        jobs.pause_job(name=JOB)
    assert jobs.resume_job(name=JOB).state == scheduler_v1.Job.State.ENABLED


# What a target receives.
def test_headers_cloud_tasks_ignores_or_sets_are_not_the_tasks(
    emulator: CloudTasksEmulator, paths: tuple[HTTPServer, list[tuple[str, Request]]]
) -> None:
    server, hits = paths
    emulator.create_queue(QUEUE)
    own = {
        "Host": "evil.example",
        "User-Agent": "mine",
        "X-Google-Thing": "1",
        "x-appengine-queuename": "fake",
        "x-cloudtasks-taskretrycount": "99",
        "Authorization": "Bearer forged",
        "X-Kept": "yes",
    }
    task = {"httpRequest": {"url": server.url_for("/ok"), "headers": own, "body": "e30="}}
    emulator.api.create_task(QUEUE, {"task": task})
    emulator.join(timeout=10)
    (_, request), = hits  # fmt: skip
    headers = request.headers
    assert headers["User-Agent"] == "Google-Cloud-Tasks"
    assert headers.getlist("X-CloudTasks-TaskRetryCount") == ["0"]
    assert headers["Host"] == f"127.0.0.1:{server.port}"
    assert "X-Google-Thing" not in headers and "X-AppEngine-QueueName" not in headers
    assert headers["X-Kept"] == "yes" and headers["Authorization"] == "Bearer forged"


def test_headers_cloud_scheduler_ignores_or_sets_are_not_the_jobs(
    emulator: CloudTasksEmulator, paths: tuple[HTTPServer, list[tuple[str, Request]]]
) -> None:
    server, hits = paths
    own = {"User-Agent": "mine", "X-CloudScheduler-JobName": "other", "X-Google-Thing": "1"}
    job = {"name": JOB, "schedule": "0 3 * * *"}
    job["httpTarget"] = {"uri": server.url_for("/ok"), "headers": own, "body": "e30="}  # type: ignore[assignment]
    emulator.scheduler_api.create_job(PARENT, job)
    emulator.scheduler_api.run_job(JOB)
    wait_for(lambda: hits)
    headers = hits[0][1].headers
    assert headers["User-Agent"] == "Google-Cloud-Scheduler"
    assert headers.getlist("X-CloudScheduler-JobName") == ["j"]
    assert headers["Content-Type"] == "application/octet-stream"
    assert "X-Google-Thing" not in headers


@pytest.mark.parametrize(
    ("path", "method", "body"), [("/moved", "GET", b""), ("/kept", "POST", b"{}")]
)
@pytest.mark.parametrize("run", [False, True], ids=["loop", "run-task"])
def test_a_redirect_is_followed_within_one_attempt(
    emulator: CloudTasksEmulator,
    paths: tuple[HTTPServer, list[tuple[str, Request]]],
    path: str,
    method: str,
    body: bytes,
    run: bool,
) -> None:
    server, hits = paths
    emulator.create_queue(QUEUE)
    task: dict[str, Any] = {"httpRequest": {"url": server.url_for(path), "body": "e30="}}
    if run:  # RunTask goes out from a pool thread, with the blocking sender.
        task["scheduleTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    created = emulator.api.create_task(QUEUE, {"task": task})
    if run:
        emulator.api.run_task(created["name"])
    emulator.join(timeout=10)
    assert [(p, r.method, r.get_data()) for p, r in hits] == [
        (path, "POST", b"{}"),
        ("/ok", method, body),
    ]
    assert [d.status for d in emulator.deliveries()] == [200]


def test_a_redirect_to_another_scheme_is_not_followed(
    emulator: CloudTasksEmulator, paths: tuple[HTTPServer, list[tuple[str, Request]]]
) -> None:
    server, hits = paths
    emulator.create_queue(QUEUE, retryConfig={"maxAttempts": 1})
    emulator.api.create_task(QUEUE, {"task": {"httpRequest": {"url": server.url_for("/tls")}}})
    emulator.join(timeout=10)
    assert [p for p, _ in hits] == ["/tls"]
    assert [d.status for d in emulator.deliveries()] == [302]


# English-like schedules: no reliable X-CloudScheduler-ScheduleTime, and a tasklease worker's
# answer to such a run (README, "Cloud Scheduler").
@pytest.fixture
def worker_url() -> Iterator[str]:
    router = Router()

    @router.scheduled("report")
    def report(ctx: Any) -> str:
        return "done"

    server = make_server(
        "127.0.0.1", 0, create_app(router, store=MemoryStore(), auth="none"), threaded=True
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.port}/jobs/report"
    server.shutdown()
    thread.join(timeout=5)


def test_an_english_like_job_sends_no_schedule_time_and_a_worker_rejects_its_run(
    emulator: CloudTasksEmulator, worker_url: str
) -> None:
    job = {"name": JOB, "schedule": "every 5 minutes", "httpTarget": {"uri": worker_url}}
    emulator.scheduler_api.create_job(PARENT, job)
    emulator.scheduler_api.run_job(JOB)
    wait_for(emulator.deliveries)
    (delivery,) = emulator.deliveries()
    # Without a schedule time the run has no key to be claimed once by: refused, not run.
    assert (delivery.status, delivery.outcome) == (400, "rejected")


def test_a_unix_cron_job_sends_its_schedule_time_to_the_worker(
    emulator: CloudTasksEmulator, worker_url: str
) -> None:
    job = {"name": JOB, "schedule": "0 3 * * *", "httpTarget": {"uri": worker_url}}
    emulator.scheduler_api.create_job(PARENT, job)
    emulator.scheduler_api.run_job(JOB)
    wait_for(emulator.deliveries)
    assert emulator.deliveries()[0].status == 200
