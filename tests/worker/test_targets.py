"""Built-in proxy targets through the worker app, against Google's APIs faked on loopback gRPC
and driven by Google's own client libraries."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import flask
import grpc
import pytest

from tasklease.errors import ConfigurationError
from tasklease.testing.google_apis import FakeGoogleApis
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores import MemoryStore
from tasklease.worker.stores.base import retries as store_retries
from tasklease.worker.targets import (
    ProxyTarget,
    cloud_build_trigger,
    cloud_run_job,
    workflows_execution,
)
from tests.support.helpers import FakeClock, SwitchableStore, job_headers

WORKFLOW = "projects/p/locations/us-central1/workflows/export"
JOB = "projects/p/locations/us-central1/jobs/reindex"
TRIGGER = "projects/p/locations/global/triggers/release"


@dataclass(frozen=True)
class Case:
    """One API: how to declare its target, which start call to fail, what it started."""

    api: str
    start_method: str
    target: Callable[[FakeGoogleApis], ProxyTarget[Any]]
    keys: Callable[[FakeGoogleApis], list[str | None]]  # The key each start carried, in order.

    def started(self, apis: FakeGoogleApis) -> int:
        return len(self.keys(apis))

    def fake(self, apis: FakeGoogleApis) -> Any:
        return getattr(apis, self.api)


def _workflow_keys(apis: FakeGoogleApis) -> list[str | None]:
    assert apis.workflows is not None
    return [
        json.loads(e.argument)["tasklease"]["idempotency_key"] for e in apis.workflows.executions
    ]


def _run_keys(apis: FakeGoogleApis) -> list[str | None]:
    assert apis.run is not None
    return [
        next(
            (
                v.value
                for v in e.template.containers[0].env
                if v.name == "TASKLEASE_IDEMPOTENCY_KEY"
            ),
            None,
        )
        for e in apis.run.executions
    ]


def _build_keys(apis: FakeGoogleApis) -> list[str | None]:
    assert apis.build is not None
    return [b.substitutions.get("_TASKLEASE_IDEMPOTENCY_KEY") for b in apis.build.builds]


def _run_target(apis: FakeGoogleApis) -> ProxyTarget[Any]:
    jobs, executions = apis.run_clients()
    return cloud_run_job(JOB, env={"MODE": "full"}, client=jobs, executions_client=executions)


CASES = [
    Case(
        "workflows",
        "CreateExecution",
        lambda apis: workflows_execution(
            WORKFLOW, argument={"bucket": "exports"}, client=apis.workflows_client()
        ),
        _workflow_keys,
    ),
    Case("run", "RunJob", _run_target, _run_keys),
    Case(
        "build",
        "RunBuildTrigger",
        lambda apis: cloud_build_trigger(
            TRIGGER, substitutions={"_ENV": "prod"}, branch="main", client=apis.build_client()
        ),
        _build_keys,
    ),
]


@pytest.fixture
def apis() -> Iterator[FakeGoogleApis]:
    with FakeGoogleApis() as running:
        yield running


@pytest.fixture(params=CASES, ids=[case.api for case in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    case: Case = request.param
    return case


@pytest.fixture
def store() -> SwitchableStore:
    return SwitchableStore(MemoryStore())


@dataclass
class Proxy:
    app: flask.Flask
    target: ProxyTarget[Any]

    def deliver(self, schedule_time: str = "2026-10-16T12:00:00Z") -> Any:
        return self.app.test_client().post(
            "/jobs/export", headers=job_headers("export", schedule_time), data=b""
        )


@pytest.fixture
def proxy(case: Case, apis: FakeGoogleApis, store: SwitchableStore, clock: FakeClock) -> Proxy:
    router = Router()
    target = router.proxy_job("export", target=case.target(apis), lease=timedelta(minutes=1))
    return Proxy(create_app(router, store=store, auth="none", clock=clock), target)


def outcome(response: Any) -> tuple[int, str]:
    return response.status_code, response.headers["X-Tasklease-Outcome"]


def test_duplicate_deliveries_start_one_execution_and_get_its_name(
    proxy: Proxy, case: Case, apis: FakeGoogleApis
) -> None:
    first = proxy.deliver()
    assert outcome(first) == (200, "processed")
    result = first.json["result"]
    assert (result["target"], result["adopted"]) == (case.api, False)
    again = proxy.deliver(schedule_time="2026-10-16T05:00:00-07:00")  # The same slot.
    assert outcome(again) == (200, "duplicate")
    assert again.json["result"] == result
    assert case.started(apis) == 1
    assert result["name"].startswith(proxy.target.resource.rsplit("/", 2)[0])


def test_a_duplicate_arriving_while_the_start_is_in_flight_starts_nothing(
    proxy: Proxy, case: Case, apis: FakeGoogleApis
) -> None:
    gate = case.fake(apis).gates[case.start_method] = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(proxy.deliver)
        while case.fake(apis).calls[case.start_method] == 0:
            time.sleep(0.005)  # The first delivery is inside the API call now.
        assert outcome(proxy.deliver()) == (409, "in_progress")
        gate.set()
        assert outcome(first.result(timeout=10)) == (200, "processed")
    assert case.started(apis) == 1


def test_the_run_key_travels_downstream(proxy: Proxy, case: Case, apis: FakeGoogleApis) -> None:
    proxy.deliver()
    proxy.deliver(schedule_time="2026-10-17T12:00:00Z")
    keys = case.keys(apis)
    assert len(keys) == 2 and len(set(keys)) == 2
    for key in keys:
        assert key is not None and str(uuid.UUID(key)) == key


def test_a_crash_after_the_call_is_adopted_by_the_retry_not_started_again(
    proxy: Proxy,
    case: Case,
    apis: FakeGoogleApis,
    store: SwitchableStore,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store_retries, "FINISH_RETRY_PAUSES", (0.0,))
    store.down_after_claim = True  # The API call is made; recording it fails: a crash.
    assert outcome(proxy.deliver()) == (503, "unrecorded")
    assert case.started(apis) == 1
    store.down = store.down_after_claim = False
    assert outcome(proxy.deliver()) == (409, "in_progress")  # The dead attempt's lease.
    clock.advance(timedelta(minutes=2))
    retry = proxy.deliver()
    assert outcome(retry) == (200, "processed")
    assert retry.json["result"]["adopted"] is True
    assert case.started(apis) == 1
    assert outcome(proxy.deliver()) == (200, "duplicate")
    assert case.started(apis) == 1


def test_a_5xx_on_start_is_released_and_the_retry_starts_once(
    proxy: Proxy, case: Case, apis: FakeGoogleApis
) -> None:
    case.fake(apis).fail(case.start_method, grpc.StatusCode.UNAVAILABLE)
    assert outcome(proxy.deliver()) == (500, "released")
    assert case.started(apis) == 0
    retry = proxy.deliver()
    assert outcome(retry) == (200, "processed")
    assert retry.json["result"]["adopted"] is False
    assert case.started(apis) == 1
    assert case.fake(apis).calls[case.start_method] == 2  # No automatic retry of a start.


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
    ],
)
def test_a_4xx_on_start_is_a_dead_letter(
    proxy: Proxy, case: Case, apis: FakeGoogleApis, code: grpc.StatusCode
) -> None:
    case.fake(apis).fail(case.start_method, code)
    response = proxy.deliver()
    assert outcome(response) == (200, "failed")
    assert "PermanentFailure" in response.json["message"]
    assert outcome(proxy.deliver()) == (200, "duplicate")
    assert case.started(apis) == 0


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL, grpc.StatusCode.ABORTED]
)
def test_other_errors_release_the_run(
    proxy: Proxy, case: Case, apis: FakeGoogleApis, code: grpc.StatusCode
) -> None:
    case.fake(apis).fail(case.start_method, code)
    assert outcome(proxy.deliver()) == (500, "released")


def test_a_failing_look_up_on_a_retry_starts_nothing(
    proxy: Proxy,
    case: Case,
    apis: FakeGoogleApis,
    store: SwitchableStore,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store_retries, "FINISH_RETRY_PAUSES", (0.0,))
    store.down_after_claim = True
    proxy.deliver()
    store.down = store.down_after_claim = False
    clock.advance(timedelta(minutes=2))
    list_method = "ListBuilds" if case.api == "build" else "ListExecutions"
    case.fake(apis).fail(list_method, grpc.StatusCode.PERMISSION_DENIED)
    assert outcome(proxy.deliver()) == (200, "failed")  # Not a second start, unseen.
    assert case.fake(apis).calls[list_method] == 1
    assert case.started(apis) == 1


def ctx_for(attempt: int = 1, run_id: str | None = None) -> TaskContext:
    return TaskContext(
        kind="scheduler",
        handler="export",
        run_id=run_id or uuid.uuid4().hex * 2,
        attempt_id="a",
        fencing_token=attempt,
        attempt=attempt,
        lease_expires=datetime(2026, 10, 16, 12, 5, tzinfo=UTC),
        schedule_time=datetime(2026, 10, 16, 12, tzinfo=UTC),
    )


def test_workflows_argument_merges_the_key_into_the_given_object(apis: FakeGoogleApis) -> None:
    target = workflows_execution(
        WORKFLOW, argument={"bucket": "b"}, labels={"team": "data"}, client=apis.workflows_client()
    )
    ctx = ctx_for()
    target(ctx)
    assert apis.workflows is not None
    [started] = apis.workflows.executions
    assert json.loads(started.argument) == {
        "bucket": "b",
        "tasklease": {
            "idempotency_key": ctx.idempotency_key,
            "schedule_time": "2026-10-16T12:00:00+00:00",
        },
    }
    assert dict(started.labels) == {"team": "data", "tasklease_key": ctx.idempotency_key}


def test_workflows_look_up_reads_the_full_view_and_filters_on_the_label(
    apis: FakeGoogleApis,
) -> None:
    target = workflows_execution(WORKFLOW, client=apis.workflows_client())
    first, other = ctx_for(), ctx_for()
    target(other)
    name = target(first)["name"]
    retry = ctx_for(attempt=2, run_id=first.run_id)
    assert target(retry) == {
        "target": "workflows",
        "resource": WORKFLOW,
        "name": name,
        "adopted": True,
    }
    assert apis.workflows is not None and len(apis.workflows.executions) == 2


def test_workflows_look_up_scans_the_newest_executions_if_the_label_filter_is_refused(
    apis: FakeGoogleApis,
) -> None:
    assert apis.workflows is not None
    apis.workflows.label_filter = False
    target = workflows_execution(WORKFLOW, client=apis.workflows_client())
    first = ctx_for()
    name = target(first)["name"]
    target(ctx_for())
    retry = ctx_for(attempt=2, run_id=first.run_id)
    assert target(retry)["name"] == name
    assert apis.workflows.calls["ListExecutions"] == 2  # Refused with the filter, then without.


def test_cloud_run_overrides_carry_the_key_next_to_the_given_ones(apis: FakeGoogleApis) -> None:
    jobs, executions = apis.run_clients()
    target = cloud_run_job(
        JOB,
        container="app",
        args=["--full"],
        env={"MODE": "full"},
        task_count=3,
        task_timeout=timedelta(minutes=10),
        client=jobs,
        executions_client=executions,
    )
    ctx = ctx_for()
    result = target(ctx)
    assert apis.run is not None
    [request] = apis.run.requests
    [override] = request.overrides.container_overrides
    assert override.name == "app" and list(override.args) == ["--full"]
    assert {e.name: e.value for e in override.env} == {
        "MODE": "full",
        "TASKLEASE_IDEMPOTENCY_KEY": ctx.idempotency_key,
        "TASKLEASE_SCHEDULE_TIME": "2026-10-16T12:00:00+00:00",
    }
    assert request.overrides.task_count == 3
    assert result["name"] == f"{JOB}/executions/reindex-00001"
    assert result["operation"].startswith("projects/p/locations/us-central1/operations/")


def test_cloud_build_source_carries_the_key_as_a_substitution(apis: FakeGoogleApis) -> None:
    target = cloud_build_trigger(
        TRIGGER, substitutions={"_ENV": "prod"}, client=apis.build_client()
    )
    ctx = ctx_for()
    result = target(ctx)
    assert apis.build is not None
    [build] = apis.build.builds
    assert dict(build.substitutions) == {
        "_ENV": "prod",
        "_TASKLEASE_IDEMPOTENCY_KEY": ctx.idempotency_key,
        "_TASKLEASE_SCHEDULE_TIME": "2026-10-16T12:00:00+00:00",
    }
    assert build.build_trigger_id == "release"
    assert result["name"] == f"projects/p/locations/global/builds/{build.id}"


def test_cloud_build_look_up_ignores_builds_of_other_runs_and_triggers(
    apis: FakeGoogleApis,
) -> None:
    target = cloud_build_trigger(TRIGGER, client=apis.build_client())
    other = cloud_build_trigger(
        "projects/p/locations/global/triggers/other", client=apis.build_client()
    )
    ctx = ctx_for()
    other(ctx)  # Same key, another trigger.
    target(ctx_for())
    retry = ctx_for(attempt=2, run_id=ctx.run_id)
    assert target(retry)["adopted"] is False
    assert apis.build is not None and len(apis.build.builds) == 3


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (lambda: workflows_execution("workflows/w"), "projects/P/locations/L/workflows/W"),
        (lambda: workflows_execution(WORKFLOW, argument={"tasklease": 1}), "reserved"),
        (lambda: workflows_execution(WORKFLOW, argument={"x": object()}), "not JSON"),
        (lambda: cloud_run_job("jobs/j"), "projects/P/locations/L/jobs/J"),
        (lambda: cloud_run_job(JOB, env={"TASKLEASE_IDEMPOTENCY_KEY": "x"}), "reserved"),
        (lambda: cloud_build_trigger("triggers/t"), "projects/P/locations/L/triggers/T"),
        (lambda: cloud_build_trigger(TRIGGER, substitutions={"ENV": "x"}), "_[A-Z0-9_]+"),
        (lambda: cloud_build_trigger(TRIGGER, branch="a", tag="b"), "at most one"),
    ],
)
def test_declarations_that_cannot_work_are_refused_at_start_up(
    declare: Callable[[], Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        declare()


def test_a_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "google.cloud.workflows.executions_v1", None)
    target = workflows_execution(WORKFLOW)
    with pytest.raises(ConfigurationError, match=r"pip install 'tasklease\[workflows\]'"):
        target.client()


def test_the_emulator_variable_takes_loopback_hosts_only(
    apis: FakeGoogleApis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKLEASE_WORKFLOWS_EMULATOR_HOST", apis.host)
    assert workflows_execution(WORKFLOW)(ctx_for())["adopted"] is False
    monkeypatch.setenv("TASKLEASE_WORKFLOWS_EMULATOR_HOST", "example.com:443")
    with pytest.raises(ConfigurationError, match="loopback"):
        workflows_execution(WORKFLOW).client()
