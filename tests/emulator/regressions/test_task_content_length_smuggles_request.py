"""Finding: a task's own ``Content-Length`` header went to the target as it was: http.client
does not add its own when the caller gives one, so ``Content-Length: 0`` ended the request
before its body, and the target read the body as a second request on the emulator's kept-alive
connection (its answer was then taken for another attempt's). Content-Length is computed by
Cloud Tasks ("will be ignored or replaced", HttpRequest.headers in target.proto): the sender
frames every request itself."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from tasklease.emulator import CloudTasksEmulator

QUEUE = "projects/p/locations/us-central1/queues/q"
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture
def server(_target_server: HTTPServer) -> Iterator[tuple[HTTPServer, dict[str, list[bytes]]]]:
    hits: dict[str, list[bytes]] = {"task": [], "smuggled": []}

    def recorder(name: str):  # type: ignore[no-untyped-def]
        def handle(request: Request) -> Response:
            hits[name].append(request.get_data())
            return Response("ok")

        return handle

    _target_server.clear()
    _target_server.expect_request("/task").respond_with_handler(recorder("task"))
    _target_server.expect_request("/smuggled").respond_with_handler(recorder("smuggled"))
    yield _target_server, hits
    _target_server.clear()


@pytest.mark.parametrize("spelling", ["Content-Length", "content-length"])
def test_a_tasks_own_content_length_cannot_smuggle_a_request(
    server: tuple[HTTPServer, dict[str, list[bytes]]], spelling: str
) -> None:
    target, hits = server
    with CloudTasksEmulator() as emulator:
        emulator.create_queue(QUEUE)
        http = {
            "url": target.url_for("/task"),
            "headers": {spelling: "0"},
            "body": base64.b64encode(SMUGGLED).decode(),
        }
        emulator.api.create_task(QUEUE, {"task": {"httpRequest": http}})
        emulator.join(timeout=10)
    assert hits == {"task": [SMUGGLED], "smuggled": []}
