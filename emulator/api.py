"""The Cloud Tasks v2 REST API (the subset ``google-cloud-tasks`` uses), served by Flask.

Resource paths follow the googleapis HTTP bindings: ``/v2/projects/*/locations/*/queues``,
``.../queues/*``, ``.../queues/*:pause|resume|purge``, ``.../queues/*/tasks``,
``.../tasks/*`` and ``.../tasks/*:run``. Errors use Google's JSON error shape.
"""

from __future__ import annotations

import json
import random
import re
import time
from typing import Any

import flask

from emulator import model
from emulator.db import EmulatorDB, TaskRow
from emulator.dispatcher import Dispatcher
from emulator.model import ApiError
from emulator.oidc import TokenIssuer

CERTS_PATH = "/oauth2/v1/certs"
# Lets the worker cache the keys. Short: a new data dir on the same port means a new key.
CERTS_MAX_AGE_SECONDS = 300
_LOCATION = re.compile(r"projects/[^/]+/locations/[^/]+")
_QUEUE = re.compile(r"(projects/[^/]+/locations/[^/]+/queues/[^/:]+)")
_DEFAULT_PAGE_SIZE, _MAX_PAGE_SIZE = 100, 1000


class CloudTasksApi:
    """Request handling on top of the emulator's database and dispatcher."""

    def __init__(
        self, db: EmulatorDB, dispatcher: Dispatcher, issuer: TokenIssuer, dedup_window: float
    ) -> None:
        self.db = db
        self.dispatcher = dispatcher
        self.issuer = issuer
        self.dedup_window = dedup_window

    def app(self) -> flask.Flask:
        app = flask.Flask("tasklease-emulator")
        app.add_url_rule(
            "/v2/<path:resource>",
            "api",
            self._route,
            methods=["GET", "POST", "PATCH", "DELETE"],
        )
        app.add_url_rule(CERTS_PATH, "certs", self._certs)
        app.add_url_rule("/healthz", "health", lambda: {"status": "ok"})
        return app

    def _certs(self) -> flask.Response:
        response = flask.jsonify(self.issuer.certs())
        response.headers["Cache-Control"] = f"public, max-age={CERTS_MAX_AGE_SECONDS}"
        return response

    def _route(self, resource: str) -> flask.Response:
        try:
            status, body = self._dispatch(flask.request.method, resource)
        except ApiError as exc:
            status, body = exc.code, exc.body()
        return flask.Response(json.dumps(body), status=status, content_type="application/json")

    def _dispatch(self, method: str, resource: str) -> tuple[int, dict[str, Any]]:
        resource, _, verb = resource.partition(":")
        parts = resource.split("/")
        if len(parts) == 5 and parts[4] == "queues" and _LOCATION.fullmatch("/".join(parts[:4])):
            parent = "/".join(parts[:4])
            if method == "POST":
                return 200, self.create_queue(parent, _json_body())
            if method == "GET":
                return 200, self.list_queues(parent)
        if len(parts) == 6 and _QUEUE.fullmatch(resource):
            if verb:
                if method == "POST" and verb in ("pause", "resume", "purge"):
                    return 200, self.change_queue(resource, verb)
            elif method == "GET":
                return 200, self._queue(resource)
            elif method == "PATCH":
                return 200, self.update_queue(resource, _json_body())
            elif method == "DELETE":
                self.db.delete_queue(self._queue(resource)["name"], _now_us())
                return 200, {}
        if len(parts) == 7 and parts[6] == "tasks" and _QUEUE.fullmatch("/".join(parts[:6])):
            queue = "/".join(parts[:6])
            if method == "POST":
                return 200, self.create_task(queue, _json_body())
            if method == "GET":
                return 200, self.list_tasks(queue)
        if len(parts) == 8 and parts[6] == "tasks" and _QUEUE.fullmatch("/".join(parts[:6])):
            if verb == "run" and method == "POST":
                return 200, self.run_task(resource, _json_body())
            if not verb and method == "GET":
                return 200, self._task_view(self._task(resource), _view_param())
            if not verb and method == "DELETE":
                if not self.db.delete_task(resource, _now_us()):
                    raise ApiError(404, f"task {resource} not found")
                return 200, {}
        raise ApiError(404, f"no method {method} {resource}{':' + verb if verb else ''}")

    def create_queue(self, parent: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body.get("name", "")
        if not name.startswith(parent + "/queues/"):
            raise ApiError(400, f"queue.name must be {parent}/queues/QUEUE_ID, not {name!r}")
        if self.db.get_queue(name) is not None:
            raise ApiError(409, f"queue {name} already exists")
        config = model.parse_queue(name, {k: v for k, v in body.items() if k != "name"})
        self.db.put_queue(name, config, _now_us())
        self.dispatcher.wake()
        return config

    def list_queues(self, parent: str) -> dict[str, Any]:
        queues = self.db.list_queues(parent)
        return {"queues": queues} if queues else {}

    def update_queue(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        current = self._queue(name)
        if body.get("name", name) != name:
            raise ApiError(400, "queue.name cannot be changed")
        config = model.merge_queue(current, body, flask.request.args.get("updateMask"))
        self.db.put_queue(name, config, _now_us())
        self.dispatcher.wake()
        return config

    def change_queue(self, name: str, verb: str) -> dict[str, Any]:
        config = self._queue(name)
        if verb == "purge":
            self.db.purge_queue(name, _now_us())
            config["purgeTime"] = model.rfc3339(_now_us())
        else:
            config["state"] = "PAUSED" if verb == "pause" else "RUNNING"
        self.db.put_queue(name, config, _now_us())
        self.dispatcher.wake()
        return config

    def create_task(self, queue: str, body: dict[str, Any]) -> dict[str, Any]:
        if not self.db.has_queue(queue):
            raise ApiError(404, f"queue {queue} not found")
        now_us = _now_us()
        spec, view = model.parse_new_task(queue, body, now_us)
        if not spec.get("name"):
            # Like Cloud Tasks' own generated IDs: numeric, not sequential.
            spec["name"] = f"{queue}/tasks/{random.getrandbits(63)}"
        schedule_us = model.micros_of(spec["scheduleTime"]) if spec.get("scheduleTime") else now_us
        spec["scheduleTime"] = model.rfc3339(schedule_us)
        spec.setdefault("dispatchDeadline", model.duration(model.DEFAULT_DISPATCH_DEADLINE))
        row = TaskRow(
            spec["name"],
            queue,
            spec,
            schedule_us,
            now_us,
            0,
            0,
            None,
            None,
            None,
            None,
            None,
            in_flight=False,
        )
        # A name is taken while the task exists and for dedup_window after it ran or went.
        if not self.db.insert_task(row, now_us - int(self.dedup_window * 1_000_000)):
            raise ApiError(409, "Requested entity already exists")
        self.dispatcher.wake()
        return self._task_view(row, view)

    def list_tasks(self, queue: str) -> dict[str, Any]:
        self._queue(queue)
        try:
            size = int(flask.request.args.get("pageSize") or _DEFAULT_PAGE_SIZE)
            offset = int(flask.request.args.get("pageToken") or 0)
        except ValueError as exc:
            raise ApiError(400, f"invalid pageSize or pageToken: {exc}") from exc
        if size < 0 or offset < 0:
            raise ApiError(400, "pageSize and pageToken must not be negative")
        size = min(size or _DEFAULT_PAGE_SIZE, _MAX_PAGE_SIZE)
        rows = self.db.list_tasks(queue, size + 1, offset)
        result: dict[str, Any] = {"tasks": [self._task_view(r, _view_param()) for r in rows[:size]]}
        if len(rows) > size:
            result["nextPageToken"] = str(offset + size)
        return result if rows else {}

    def run_task(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        row = self._task(name)
        if not self.dispatcher.run_now(name):
            raise ApiError(412, f"task {name} is being dispatched", "FAILED_PRECONDITION")
        return self._task_view(row, body.get("responseView") or "BASIC")

    def _queue(self, name: str) -> dict[str, Any]:
        config = self.db.get_queue(name)
        if config is None:
            raise ApiError(404, f"queue {name} not found")
        return config

    def _task(self, name: str) -> TaskRow:
        row = self.db.get_task(name)
        if row is None:
            raise ApiError(404, f"task {name} not found")
        return row

    @staticmethod
    def _task_view(row: TaskRow, view: str | int) -> dict[str, Any]:
        runtime = {
            "createTime": model.rfc3339(row.create_us),
            "scheduleTime": model.rfc3339(row.schedule_us),
            "dispatchCount": row.dispatch_count,
            "responseCount": row.response_count,
            "firstAttempt": row.first_attempt,
            "lastAttempt": row.last_attempt,
        }
        return model.task_view(row.spec, runtime, "FULL" if view in ("FULL", 2, "2") else "BASIC")


def _json_body() -> dict[str, Any]:
    if not flask.request.data:
        return {}
    try:
        body = json.loads(flask.request.data)
    except ValueError as exc:
        raise ApiError(400, f"request body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def _view_param() -> str:
    return flask.request.args.get("responseView") or "BASIC"


def _now_us() -> int:
    return time.time_ns() // 1000
