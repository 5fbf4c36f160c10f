"""The Cloud Tasks v2 and Cloud Scheduler v1 REST APIs over HTTP, served by Flask in front
of :class:`CloudTasksApi` and :class:`SchedulerApi`.

Resource paths follow the googleapis HTTP bindings: ``/v2/projects/*/locations``,
``.../locations/*/queues``, ``.../queues/*``, ``.../queues/*:pause|resume|purge``,
``.../queues/*/tasks``, ``.../tasks:batchCreate``, ``.../tasks/*``, ``.../tasks/*:run`` and
``.../locations/*/operations/*``; ``/v1/projects/*/locations``,
``.../locations/*/jobs``, ``.../jobs/*`` and ``.../jobs/*:pause|resume|run``. Errors use
Google's JSON error shape.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import flask

from tasklease.emulator import locations
from tasklease.emulator.api import CERTS_PATH, CloudTasksApi
from tasklease.emulator.batch import BatchApi
from tasklease.emulator.model import ApiError
from tasklease.emulator.oidc import TokenIssuer
from tasklease.emulator.scheduler_api import SchedulerApi

_log = logging.getLogger("tasklease.emulator")
# Lets the worker cache the keys. Short: a new data dir on the same port means a new key.
CERTS_MAX_AGE_SECONDS = 300
_LOCATIONS = re.compile(r"projects/[^/]+/locations")
_LOCATION = re.compile(r"projects/[^/]+/locations/[^/]+")
_QUEUE = re.compile(r"projects/[^/]+/locations/[^/]+/queues/[^/:]+")
_QUEUE_VERBS = frozenset({"pause", "resume", "purge"})
_IAM_VERBS = {
    "getIamPolicy": "get_iam_policy",
    "setIamPolicy": "set_iam_policy",
    "testIamPermissions": "test_iam_permissions",
}
_OPERATION = re.compile(r"projects/[^/]+/locations/[^/]+/operations/[^/:]+")
_JOB = re.compile(r"projects/[^/]+/locations/[^/]+/jobs/[^/:]+")


def create_app(
    api: CloudTasksApi, scheduler: SchedulerApi, issuer: TokenIssuer, batch: BatchApi
) -> flask.Flask:
    """The emulator's Flask app: ``/v2/...`` (Cloud Tasks, BatchCreateTasks and its
    operations included), ``/v1/...`` (Cloud Scheduler), the OIDC keys and a health check."""
    app = flask.Flask("tasklease-emulator")
    methods = ["GET", "POST", "PATCH", "DELETE"]
    tasks = _RestRoutes(api, batch)
    app.add_url_rule("/v2/<path:resource>", "api", tasks.route, methods=methods)
    jobs = _SchedulerRoutes(scheduler)
    app.add_url_rule("/v1/<path:resource>", "scheduler_api", jobs.route, methods=methods)

    def certs() -> flask.Response:
        response = flask.jsonify(issuer.certs())
        response.headers["Cache-Control"] = f"public, max-age={CERTS_MAX_AGE_SECONDS}"
        return response

    app.add_url_rule(CERTS_PATH, "certs", certs)
    app.add_url_rule("/healthz", "health", lambda: {"status": "ok"})
    # gcloud without --location asks App Engine whether the project has an app, and only
    # then takes ListLocations' first entry (googlecloudsdk/command_lib/tasks/app.py). With
    # api_endpoint_overrides/appengine pointed here, every project has one.
    app.add_url_rule("/v1/apps/<project>", "app_engine_app", _app_engine_app)
    return app


def json_response(status: int, body: dict[str, Any]) -> flask.Response:
    return flask.Response(json.dumps(body), status=status, content_type="application/json")


def json_body() -> dict[str, Any]:
    """The request's JSON object ({} when empty); INVALID_ARGUMENT otherwise."""
    if not flask.request.data:
        return {}
    try:
        body = json.loads(flask.request.data)
    except ValueError as exc:
        raise ApiError(400, f"request body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def _app_engine_app(project: str) -> dict[str, Any]:
    return {"name": f"apps/{project}", "id": project, "locationId": "us-central"}


class _RestRoutes:
    def __init__(self, api: CloudTasksApi, batch: BatchApi) -> None:
        self.api = api
        self.batch = batch

    def route(self, resource: str) -> flask.Response:
        try:
            status, body = self._dispatch(flask.request.method, resource)
        except ApiError as exc:
            status, body = exc.code, exc.body()
        except Exception as exc:  # Google's JSON error shape even for the emulator's own bugs.
            _log.exception("%s %s failed", flask.request.method, resource)
            error = ApiError(500, f"internal error: {type(exc).__name__}", "INTERNAL")
            status, body = error.code, error.body()
        return json_response(status, body)

    def _dispatch(self, method: str, resource: str) -> tuple[int, dict[str, Any]]:
        resource, _, verb = resource.partition(":")
        parts = resource.split("/")
        args = flask.request.args
        api = self.api
        reading = method == "GET" and not verb
        if reading and _LOCATIONS.fullmatch(resource):
            return 200, api.list_locations(parts[1])
        if reading and len(parts) == 4 and _LOCATION.fullmatch(resource):
            return 200, api.get_location(parts[1], parts[3])
        if reading and len(parts) == 6 and _OPERATION.fullmatch(resource):
            return 200, self.batch.get_operation(resource)
        if len(parts) == 5 and parts[4] == "queues" and _LOCATION.fullmatch("/".join(parts[:4])):
            parent = "/".join(parts[:4])
            if method == "POST" and not verb:
                return 200, api.create_queue(parent, json_body())
            if method == "GET" and not verb:
                return 200, api.list_queues(
                    parent,
                    _int_arg("pageSize"),
                    args.get("pageToken", ""),
                    args.get("filter", ""),
                )
        if len(parts) == 6 and _QUEUE.fullmatch(resource):
            if verb:
                if method == "POST" and verb in _QUEUE_VERBS:
                    return 200, api.change_queue(resource, verb)
                if method == "POST" and verb == "getIamPolicy":
                    return 200, api.get_iam_policy(resource)
                if method == "POST" and verb in _IAM_VERBS:
                    return 200, getattr(api, _IAM_VERBS[verb])(resource, json_body())
            elif method == "GET":
                return 200, api.get_queue(resource)
            elif method == "PATCH":
                return 200, api.update_queue(resource, json_body(), args.get("updateMask"))
            elif method == "DELETE":
                return 200, api.delete_queue(resource)
        if len(parts) == 7 and parts[6] == "tasks" and _QUEUE.fullmatch("/".join(parts[:6])):
            queue = "/".join(parts[:6])
            if method == "POST" and not verb:
                return 200, api.create_task(queue, json_body())
            if method == "POST" and verb == "batchCreate":
                return 200, self.batch.batch_create_tasks(queue, json_body())
            if method == "GET" and not verb:
                return 200, api.list_tasks(
                    queue, _int_arg("pageSize"), args.get("pageToken", ""), _view()
                )
        if len(parts) == 8 and parts[6] == "tasks" and _QUEUE.fullmatch("/".join(parts[:6])):
            if verb == "run" and method == "POST":
                return 200, api.run_task(resource, json_body().get("responseView") or "BASIC")
            if not verb and method == "GET":
                return 200, api.get_task(resource, _view())
            if not verb and method == "DELETE":
                return 200, api.delete_task(resource)
        raise ApiError(404, f"no method {method} {resource}{':' + verb if verb else ''}")


class _SchedulerRoutes:
    def __init__(self, api: SchedulerApi) -> None:
        self.api = api

    def route(self, resource: str) -> flask.Response:
        try:
            status, body = self._dispatch(flask.request.method, resource)
        except ApiError as exc:
            status, body = exc.code, exc.body()
        except Exception as exc:  # Google's JSON error shape even for the emulator's own bugs.
            _log.exception("%s %s failed", flask.request.method, resource)
            error = ApiError(500, f"internal error: {type(exc).__name__}", "INTERNAL")
            status, body = error.code, error.body()
        return json_response(status, body)

    def _dispatch(self, method: str, resource: str) -> tuple[int, dict[str, Any]]:
        resource, _, verb = resource.partition(":")
        parts = resource.split("/")
        args = flask.request.args
        api = self.api
        reading = method == "GET" and not verb
        if reading and _LOCATIONS.fullmatch(resource):
            return 200, api.list_locations(parts[1])
        if reading and len(parts) == 4 and _LOCATION.fullmatch(resource):
            return 200, _get_location(parts[1], parts[3])
        if len(parts) == 5 and parts[4] == "jobs" and _LOCATION.fullmatch("/".join(parts[:4])):
            parent = "/".join(parts[:4])
            if method == "POST" and not verb:
                return 200, api.create_job(parent, json_body())
            if reading:
                return 200, api.list_jobs(parent, _int_arg("pageSize"), args.get("pageToken", ""))
        if len(parts) == 6 and _JOB.fullmatch(resource):
            if method == "POST" and verb in ("pause", "resume", "run"):
                return 200, getattr(api, f"{verb}_job")(resource)
            if reading:
                return 200, api.get_job(resource)
            if method == "PATCH" and not verb:
                return 200, api.update_job(resource, json_body(), args.get("updateMask"))
            if method == "DELETE" and not verb:
                return 200, api.delete_job(resource)
        raise ApiError(404, f"no method {method} {resource}{':' + verb if verb else ''}")


def _get_location(project: str, location_id: str) -> dict[str, Any]:
    if not locations.is_region(location_id):
        raise ApiError(404, f"Location {location_id!r} is not a Cloud region")
    return locations.location(project, location_id)


def _int_arg(name: str) -> int:
    value = flask.request.args.get(name) or "0"
    try:
        return int(value)
    except ValueError as exc:
        raise ApiError(400, f"invalid {name}: {value!r}") from exc


def _view() -> str:
    return flask.request.args.get("responseView") or "BASIC"
