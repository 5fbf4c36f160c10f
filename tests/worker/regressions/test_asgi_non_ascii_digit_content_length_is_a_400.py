"""A Content-Length made of non-ASCII digits (latin-1 '²', which str.isdigit accepts but int
refuses) must be refused as a bad request like any other non-number, not crash the app."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tasklease.worker import Router
from tasklease.worker.asgi import create_asgi_app
from tasklease.worker.serving.asgi_routes import Message
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import task_headers


def test_a_content_length_of_superscript_digits_is_answered_400_not_an_exception(
    tmp_path: Path,
) -> None:
    router = Router()
    router.task("h")(lambda payload, ctx: None)
    app = create_asgi_app(router, store=SqliteStore(tmp_path / "runs.db"), auth="none")
    headers = [(k.lower().encode(), v.encode()) for k, v in task_headers().items()]
    headers.append((b"content-length", "\u00b2".encode("latin-1")))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/tasks/h",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
    }
    sent: list[Message] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 400
