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

from typing import Any

import flask

from tasklease.emulator import locations
from tasklease.emulator.api import CERTS_PATH, CloudTasksApi
from tasklease.emulator.batch import BatchApi
from tasklease.emulator.model import ApiError
from tasklease.emulator.oidc import TokenIssuer
from tasklease.emulator.rest_routes import Answer, RestCall, RestRoutes
from tasklease.emulator.scheduler_api import SchedulerApi

# Lets the worker cache the keys. Short: a new data dir on the same port means a new key.
CERTS_MAX_AGE_SECONDS = 300
_LOCATIONS = "projects/*/locations"
_LOCATION = "projects/*/locations/*"
_QUEUES = "projects/*/locations/*/queues"
_QUEUE = "projects/*/locations/*/queues/*"
_TASKS = "projects/*/locations/*/queues/*/tasks"
_TASK = "projects/*/locations/*/queues/*/tasks/*"
_OPERATION = "projects/*/locations/*/operations/*"
_JOBS = "projects/*/locations/*/jobs"
_JOB = "projects/*/locations/*/jobs/*"


def create_app(
    api: CloudTasksApi, scheduler: SchedulerApi, issuer: TokenIssuer, batch: BatchApi
) -> flask.Flask:
    """The emulator's Flask app: ``/v2/...`` (Cloud Tasks, BatchCreateTasks and its
    operations included), ``/v1/...`` (Cloud Scheduler), the OIDC keys and a health check."""
    app = flask.Flask("tasklease-emulator")
    methods = ["GET", "POST", "PATCH", "DELETE"]
    tasks = tasks_routes(api, batch)
    app.add_url_rule("/v2/<path:resource>", "api", tasks.view, methods=methods)
    jobs = scheduler_routes(scheduler)
    app.add_url_rule("/v1/<path:resource>", "scheduler_api", jobs.view, methods=methods)

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


def tasks_routes(api: CloudTasksApi, batch: BatchApi) -> RestRoutes:
    """Cloud Tasks v2's REST routes (BatchCreateTasks and its operations included)."""
    routes = RestRoutes()
    routes.add("GET", _LOCATIONS, lambda c: api.list_locations(c.segments[1]))
    routes.add("GET", _LOCATION, lambda c: api.get_location(c.segments[1], c.segments[3]))
    routes.add("GET", _OPERATION, lambda c: batch.get_operation(c.resource))
    routes.add("POST", _QUEUES, lambda c: api.create_queue(c.parent, c.body()))
    routes.add(
        "GET",
        _QUEUES,
        lambda c: api.list_queues(
            c.parent, c.int_arg("pageSize"), c.arg("pageToken"), c.arg("filter")
        ),
    )
    for verb in ("pause", "resume", "purge"):
        routes.add("POST", _QUEUE, _change_queue(api, verb), verb=verb)
    routes.add("POST", _QUEUE, lambda c: api.get_iam_policy(c.resource), verb="getIamPolicy")
    routes.add(
        "POST", _QUEUE, lambda c: api.set_iam_policy(c.resource, c.body()), verb="setIamPolicy"
    )
    routes.add(
        "POST",
        _QUEUE,
        lambda c: api.test_iam_permissions(c.resource, c.body()),
        verb="testIamPermissions",
    )
    routes.add("GET", _QUEUE, lambda c: api.get_queue(c.resource))
    routes.add("PATCH", _QUEUE, lambda c: api.update_queue(c.resource, c.body(), c.update_mask))
    routes.add("DELETE", _QUEUE, lambda c: api.delete_queue(c.resource))
    routes.add("POST", _TASKS, lambda c: api.create_task(c.parent, c.body()))
    routes.add(
        "POST", _TASKS, lambda c: batch.batch_create_tasks(c.parent, c.body()), verb="batchCreate"
    )
    routes.add(
        "GET",
        _TASKS,
        lambda c: api.list_tasks(c.parent, c.int_arg("pageSize"), c.arg("pageToken"), _view(c)),
    )
    routes.add(
        "POST",
        _TASK,
        lambda c: api.run_task(c.resource, c.body().get("responseView") or "BASIC"),
        verb="run",
    )
    routes.add("GET", _TASK, lambda c: api.get_task(c.resource, _view(c)))
    routes.add("DELETE", _TASK, lambda c: api.delete_task(c.resource))
    return routes


def scheduler_routes(api: SchedulerApi) -> RestRoutes:
    """Cloud Scheduler v1's REST routes."""
    routes = RestRoutes()
    routes.add("GET", _LOCATIONS, lambda c: api.list_locations(c.segments[1]))
    routes.add("GET", _LOCATION, lambda c: _get_location(c.segments[1], c.segments[3]))
    routes.add("POST", _JOBS, lambda c: api.create_job(c.parent, c.body()))
    routes.add(
        "GET", _JOBS, lambda c: api.list_jobs(c.parent, c.int_arg("pageSize"), c.arg("pageToken"))
    )
    routes.add("POST", _JOB, lambda c: api.pause_job(c.resource), verb="pause")
    routes.add("POST", _JOB, lambda c: api.resume_job(c.resource), verb="resume")
    routes.add("POST", _JOB, lambda c: api.run_job(c.resource), verb="run")
    routes.add("GET", _JOB, lambda c: api.get_job(c.resource))
    routes.add("PATCH", _JOB, lambda c: api.update_job(c.resource, c.body(), c.update_mask))
    routes.add("DELETE", _JOB, lambda c: api.delete_job(c.resource))
    return routes


def _change_queue(api: CloudTasksApi, verb: str) -> Answer:
    """PauseQueue, ResumeQueue or PurgeQueue."""
    return lambda c: api.change_queue(c.resource, verb)


def _app_engine_app(project: str) -> dict[str, Any]:
    return {"name": f"apps/{project}", "id": project, "locationId": "us-central"}


def _get_location(project: str, location_id: str) -> dict[str, Any]:
    if not locations.is_region(location_id):
        raise ApiError(404, f"Location {location_id!r} is not a Cloud region")
    return locations.location(project, location_id)


def _view(call: RestCall) -> str:
    return call.arg("responseView", "BASIC")
