"""Finding: a delivery body that arrives without Content-Length and without
Transfer-Encoding (a server that frames it itself and says so with ``wsgi.input_terminated``,
e.g. HTTP/2 end to end), or with an unparsable Content-Length, is read as empty: the handler
runs once on ``None`` and the run is recorded complete."""

from __future__ import annotations

import io
import json
from typing import Any

from werkzeug.datastructures import Headers
from werkzeug.test import EnvironBuilder

from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.memory.store import MemoryStore
from tests.support.helpers import FakeClock, task_headers


def _app(clock: FakeClock, seen: list[Any]) -> Any:
    router = Router()

    @router.task("ship")
    def ship(payload: Any, ctx: TaskContext) -> None:
        seen.append(payload)

    return create_app(router, store=MemoryStore(), auth="none", clock=clock)


def _call(app: Any, environ: dict[str, Any]) -> str:
    status: list[str] = []
    b"".join(app.wsgi_app(environ, lambda s, h, *a: status.append(s)))
    return status[0]


def test_a_body_framed_by_the_server_without_content_length_reaches_the_handler(
    clock: FakeClock,
) -> None:
    seen: list[Any] = []
    app = _app(clock, seen)
    body = json.dumps({"order_id": 42}).encode()
    environ = EnvironBuilder(
        path="/tasks/ship", method="POST", headers=Headers(task_headers())
    ).get_environ()
    environ.pop("CONTENT_LENGTH", None)
    environ["wsgi.input"] = io.BytesIO(body)
    environ["wsgi.input_terminated"] = True  # Gunicorn and others set it: read to EOF.
    status = _call(app, environ)
    assert seen == [{"order_id": 42}], (status, seen)


def test_an_unparsable_content_length_is_refused_not_run_on_an_empty_payload(
    clock: FakeClock,
) -> None:
    seen: list[Any] = []
    app = _app(clock, seen)
    body = json.dumps({"order_id": 42}).encode()
    environ = EnvironBuilder(
        path="/tasks/ship", method="POST", headers=Headers(task_headers())
    ).get_environ()
    environ["CONTENT_LENGTH"] = "12, 12"  # Two Content-Length headers, joined by the server.
    environ["wsgi.input"] = io.BytesIO(body)
    status = _call(app, environ)
    assert seen == [], status
    assert status.startswith("400")
