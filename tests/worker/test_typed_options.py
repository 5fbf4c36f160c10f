"""The options written once as TypedDicts (the worker's, the handlers'): every one given reaches
what it configures, each has its default in one place, and a keyword that is none of them is
refused at once, naming the one meant and every one taken, not dropped without a word."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any

import flask
import pytest

from tasklease.worker import (
    HandlerOptions,
    JobOptions,
    Router,
    TaskContext,
    WorkerOptions,
    create_app,
)
from tasklease.worker.asgi import AsgiOptions, create_asgi_app
from tasklease.worker.core import constants as c
from tasklease.worker.core.identity import Kind
from tasklease.worker.delivery.executor import Executor
from tasklease.worker.serving.app import EXECUTOR_EXTENSION
from tasklease.worker.serving.options import WorkerSettings
from tasklease.worker.stores import MemoryStore
from tasklease.worker.targets import workflows_execution

WORKFLOW = "projects/p/locations/us-central1/workflows/export"
NOON = datetime(2024, 5, 2, 12, tzinfo=UTC)


def router_with_a_task() -> Router:
    router = Router()

    @router.task("send_receipt")
    def send_receipt(payload: Any, ctx: TaskContext) -> None:
        return None

    return router


def executor_of(app: flask.Flask) -> Executor:
    executor = app.extensions[EXECUTOR_EXTENSION]
    assert isinstance(executor, Executor)
    return executor


def test_every_worker_option_has_its_default_in_the_settings() -> None:
    assert {field.name for field in fields(WorkerSettings)} == WorkerOptions.__optional_keys__
    assert AsgiOptions.__optional_keys__ == WorkerOptions.__optional_keys__ | {"threads"}


def test_create_app_takes_store_and_auth_by_position_and_its_options_by_keyword() -> None:
    store = MemoryStore()
    app = create_app(
        router_with_a_task(),
        store,
        "none",
        clock=lambda: NOON,
        project_header="X-Shop-Project",
        max_task_bytes=4096,
    )
    executor = executor_of(app)
    assert executor.store is store
    assert executor.clock() == NOON
    assert executor.project_header == "X-Shop-Project"
    assert executor.location_header == "X-Tasklease-Location"  # The default, untouched.
    response = app.test_client().post("/tasks/send_receipt", data=b"x" * 4097)
    assert response.status_code == 413


def test_a_misspelt_create_app_option_is_refused_naming_the_one_meant() -> None:
    with pytest.raises(TypeError) as refused:
        create_app(router_with_a_task(), "memory://", "none", audiance="https://w.example")  # type: ignore[call-arg]
    assert str(refused.value) == (
        "create_app() got an unexpected keyword argument 'audiance' (did you mean 'audience'?);"
        " it takes: router, store, auth, app, audience, clock, dashboard, dashboard_audience,"
        " dashboard_operators, location_header, max_task_bytes, project_header"
    )


def test_create_asgi_app_passes_the_worker_options_on_and_keeps_threads() -> None:
    store = MemoryStore()
    app = create_asgi_app(
        router_with_a_task(), store=store, auth="none", max_task_bytes=2048, threads=3
    )
    assert app.executor.store is store
    assert app.max_body_bytes == 2048
    assert app.threads == 3
    assert create_asgi_app(router_with_a_task(), "memory://", "none").threads == 40


def test_a_misspelt_create_asgi_app_option_is_refused_by_create_asgi_app() -> None:
    with pytest.raises(TypeError) as refused:
        create_asgi_app(router_with_a_task(), "memory://", "none", thread=3)  # type: ignore[call-arg]
    message = str(refused.value)
    assert message.startswith(
        "create_asgi_app() got an unexpected keyword argument 'thread' (did you mean 'threads'?)"
    )
    assert message.endswith("max_task_bytes, project_header, threads")


def test_each_common_handler_option_reaches_the_handler_spec() -> None:
    router = Router(manual_run_margin=timedelta(minutes=2))
    options: JobOptions = {
        "lease": timedelta(minutes=1),
        "retention": timedelta(days=1),
        "max_attempts": 3,
        "allowed_service_accounts": iter(["tasks@p.iam.gserviceaccount.com"]),
        "audience": "https://worker.example/jobs/nightly",
    }

    @router.scheduled("nightly", **options)
    def nightly(ctx: TaskContext) -> None:
        return None

    spec = router.handler(Kind.SCHEDULER, "nightly")
    assert spec is not None
    assert (spec.lease, spec.retention, spec.max_attempts) == (
        timedelta(minutes=1),
        timedelta(days=1),
        3,
    )
    assert spec.allowed_service_accounts == ("tasks@p.iam.gserviceaccount.com",)
    assert spec.audience == "https://worker.example/jobs/nightly"
    assert spec.manual_run_margin == timedelta(minutes=2)  # The router's, as default.


def test_a_handler_given_no_options_has_the_spec_defaults() -> None:
    router = router_with_a_task()
    spec = router.handler(Kind.TASK, "send_receipt")
    assert spec is not None
    assert (spec.lease, spec.retention, spec.max_attempts) == (
        c.DEFAULT_LEASE,
        c.DEFAULT_RETENTION,
        None,
    )
    assert (spec.allowed_service_accounts, spec.audience) == (None, None)


def test_a_proxy_job_passes_its_options_to_the_scheduled_handler() -> None:
    router = Router()
    router.proxy_job(
        "export",
        target=workflows_execution(WORKFLOW, client=object()),
        lease=timedelta(minutes=1),
        manual_run_margin=timedelta(minutes=3),
    )
    spec = router.handler(Kind.SCHEDULER, "export")
    assert spec is not None
    assert (spec.lease, spec.manual_run_margin) == (timedelta(minutes=1), timedelta(minutes=3))


def test_a_misspelt_handler_option_is_refused_naming_the_one_meant() -> None:
    with pytest.raises(TypeError) as refused:
        Router().task("send_receipt", leese=timedelta(minutes=1))  # type: ignore[call-arg]
    assert str(refused.value) == (
        "Router.task() got an unexpected keyword argument 'leese' (did you mean 'lease'?);"
        " it takes: name, concurrency_key, queue, transactional, allowed_service_accounts,"
        " audience, lease, max_attempts, retention"
    )


def test_a_scheduled_only_option_is_refused_on_a_task() -> None:
    """HandlerSpec has the field, so only the check keeps a task from taking it silently."""
    with pytest.raises(TypeError, match=r"^Router\.task\(\) got .* 'exclusive'; it takes: "):
        Router().task("send_receipt", exclusive=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"'manual_run_margin'; it takes: "):
        Router().task("send_receipt", manual_run_margin=timedelta(minutes=2))  # type: ignore[call-arg]


def test_a_misspelt_proxy_job_option_is_refused_by_proxy_job() -> None:
    with pytest.raises(TypeError) as refused:
        Router().proxy_job(
            "export",
            target=workflows_execution(WORKFLOW, client=object()),
            max_attempt=2,  # type: ignore[call-arg]
        )
    assert str(refused.value).startswith(
        "Router.proxy_job() got an unexpected keyword argument 'max_attempt'"
        " (did you mean 'max_attempts'?); it takes: name, target, allowed_service_accounts,"
    )


def test_every_handler_option_is_an_option_of_the_jobs_too() -> None:
    assert JobOptions.__optional_keys__ == HandlerOptions.__optional_keys__ | {"manual_run_margin"}
