"""A bare Flask route: what a cold start costs with no framework around the handler."""

from __future__ import annotations

from typing import Any

import flask

app = flask.Flask("bare")


@app.post("/tasks/noop")
def noop() -> Any:
    payload = flask.request.get_json(force=True)
    return {"ok": True, "n": len(payload)}
