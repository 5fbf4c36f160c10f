"""The options written once as TypedDicts (the worker's): every one given reaches
what it configures, each has its default in one place, and a keyword that is none of them is
refused at once, naming the one meant and every one taken, not dropped without a word."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

import flask
import pytest

from tasklease.worker import (
    Router,
    TaskContext,
    WorkerOptions,
    create_app,
)
from tasklease.worker.asgi import AsgiOptions, create_asgi_app
from tasklease.worker.delivery.executor import Executor
from tasklease.worker.serving.app import EXECUTOR_EXTENSION
from tasklease.worker.serving.options import WorkerSettings
from tasklease.worker.stores import MemoryStore

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
