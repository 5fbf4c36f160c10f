"""Every request gets exactly one tasklease log line and a JSON answer, whatever it carries.

Hostile paths, identities that crash a parser, and failures inside the worker itself must not
fall through to Flask's HTML pages or leave no trace in the log.
"""

from __future__ import annotations

import logging
from typing import Any

import flask
import pytest

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.observe.logs import ReadableFormatter
from tasklease.worker.stores import MemoryStore
from tests.support.helpers import job_headers, task_headers


class ExplodingStore(MemoryStore):
    """A store with a bug: claiming raises something the worker does not expect."""

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in a store")


def make_app(store: MemoryStore | None = None) -> flask.Flask:
    router = Router()

    @router.task("send_receipt")
    def send_receipt(payload: Any, ctx: TaskContext) -> None:
        return None

    @router.scheduled("nightly")
    def nightly(ctx: TaskContext) -> None:
        return None

    return create_app(router, store=store or MemoryStore(), auth="none")


def execution_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "tasklease.execution"]


def test_schedule_time_whose_offset_overflows_is_400_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="tasklease")
    response = (
        make_app()
        .test_client()
        .post("/jobs/nightly", headers=job_headers(schedule_time="9999-12-31T23:59:59-23:59"))
    )
    assert response.status_code == 400
    assert response.get_json()["outcome"] == "rejected"
    assert len(execution_lines(caplog)) == 1


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/tasks/a%0Ab", 404),
        ("POST", "/jobs/a%0D%0Ab", 404),
        ("POST", "/tasks/", 404),
        ("POST", "/jobs/", 404),
        ("POST", "/nowhere", 404),
        ("POST", "/healthz", 405),
    ],
)
def test_paths_flask_itself_rejects_get_json_and_one_log_line(
    caplog: pytest.LogCaptureFixture, method: str, path: str, status: int
) -> None:
    caplog.set_level("INFO", logger="tasklease")
    response = make_app().test_client().open(path, method=method, headers=task_headers())
    assert response.status_code == status
    assert response.is_json, response.data[:200]
    assert response.get_json()["outcome"] == "rejected"
    assert response.headers["X-Tasklease-Outcome"] == "rejected"
    [line] = execution_lines(caplog)
    assert line.tasklease["status"] == status  # type: ignore[attr-defined]


def test_routes_of_a_users_own_app_keep_their_own_error_pages() -> None:
    app = flask.Flask("users")
    create_app(Router(), store=MemoryStore(), auth="none", app=app)
    response = app.test_client().get("/not-tasklease")
    assert response.status_code == 404
    assert not response.is_json


def test_unexpected_exception_in_the_worker_is_a_json_500_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="tasklease")
    response = (
        make_app(ExplodingStore())
        .test_client()
        .post("/tasks/send_receipt", headers=task_headers(), data=b"{}")
    )
    assert response.status_code == 500
    assert response.get_json()["outcome"] == "error"
    [line] = execution_lines(caplog)
    assert line.levelno == logging.ERROR
    assert line.tasklease["status"] == 500  # type: ignore[attr-defined]
    assert "a bug in a store" not in response.get_data(as_text=True)  # No internals to callers.


def test_text_log_format_escapes_control_characters_from_requests() -> None:
    record = logging.LogRecord(
        "tasklease.execution",
        logging.INFO,
        __file__,
        1,
        "task %s: no handler",
        ("x\n12:00:00 INFO    task forged: processed\x1b[31m",),
        None,
    )
    record.tasklease = {"outcome": "rejected", "queue": "q\r\x07"}
    line = ReadableFormatter().format(record)
    assert "\n" not in line and "\r" not in line
    assert "\x1b" not in line and "\x07" not in line
    assert "\\n12:00:00" in line and "\\x1b[31m" in line


def test_a_handler_that_raises_gets_one_line_carrying_its_stack_trace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = Router()

    @router.task("flaky")
    def flaky(payload: Any, ctx: TaskContext) -> None:
        raise ValueError("the mail server said no")

    client = create_app(router, store=MemoryStore(), auth="none").test_client()
    caplog.set_level("INFO", logger="tasklease")
    caplog.clear()
    response = client.post("/tasks/flaky", headers=task_headers(), data=b"{}")
    assert response.status_code == 500
    [line] = [r for r in caplog.records if r.name.startswith("tasklease")]
    assert line.name == "tasklease.execution"
    assert line.exc_info is not None and "the mail server said no" in str(line.exc_info[1])
