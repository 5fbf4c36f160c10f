"""What an operator must notice is logged at WARNING: a delivery for a handler name the
worker does not serve (with the names it does serve, in the log only) and a dead letter."""

from __future__ import annotations

import logging
from typing import Any

import flask
import pytest

from tasklease import PermanentFailure
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.observe.logs import ReadableFormatter
from tasklease.worker.stores import MemoryStore
from tests.support.helpers import task_headers


def make_app() -> flask.Flask:
    router = Router()

    @router.task("send_welcome")
    def send_welcome(payload: Any, ctx: TaskContext) -> None:
        raise PermanentFailure("not an email address")

    @router.task("send_digest")
    def send_digest(payload: Any, ctx: TaskContext) -> None:
        return None

    @router.scheduled("nightly")
    def nightly(ctx: TaskContext) -> None:
        return None

    return create_app(router, store=MemoryStore(), auth="none")


def the_line(caplog: pytest.LogCaptureFixture) -> logging.LogRecord:
    (line,) = [r for r in caplog.records if r.name == "tasklease.execution"]
    return line


def test_a_delivery_for_an_unknown_handler_is_a_warning_naming_the_known_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="tasklease")
    response = make_app().test_client().post("/tasks/sned_welcome", headers=task_headers())
    assert response.status_code == 404
    assert b"send_welcome" not in response.data  # The answer goes to callers not yet checked.
    line = the_line(caplog)
    assert line.levelno == logging.WARNING
    text = ReadableFormatter().format(line)
    assert "task sned_welcome: no task handler of that name" in text
    assert "known_handlers=send_digest, send_welcome" in text


def test_a_dead_letter_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="tasklease")
    response = make_app().test_client().post("/tasks/send_welcome", headers=task_headers())
    assert response.get_json()["outcome"] == "failed"
    assert the_line(caplog).levelno == logging.WARNING
