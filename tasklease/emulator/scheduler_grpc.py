"""The Cloud Scheduler v1 API over gRPC: the default transport of Google's Scheduler clients.

Served on the Cloud Tasks gRPC port (Locations is already served there, for both APIs). As in
:mod:`tasklease.emulator.grpc_api`, each call converts its request message (the classes of
``google-cloud-scheduler`` itself) to the REST JSON that
:class:`~tasklease.emulator.scheduler_api.SchedulerApi` takes, so gRPC and REST share one
model, one validation and one database.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.cloud import scheduler_v1
from google.protobuf import empty_pb2

from tasklease.emulator.grpc_api import unary_method
from tasklease.emulator.scheduler_api import SchedulerApi

SERVICE = "google.cloud.scheduler.v1.CloudScheduler"

Handler = Callable[[SchedulerApi, dict[str, Any]], dict[str, Any]]

_JOB = scheduler_v1.Job.pb()

# method: (request class, response class, what it does with the request as REST JSON).
_METHODS: dict[str, tuple[Any, Any, Handler]] = {
    "ListJobs": (
        scheduler_v1.ListJobsRequest.pb(),
        scheduler_v1.ListJobsResponse.pb(),
        lambda api, r: api.list_jobs(
            r.get("parent", ""), r.get("pageSize", 0), r.get("pageToken", "")
        ),
    ),
    "GetJob": (
        scheduler_v1.GetJobRequest.pb(),
        _JOB,
        lambda api, r: api.get_job(r.get("name", "")),
    ),
    "CreateJob": (
        scheduler_v1.CreateJobRequest.pb(),
        _JOB,
        lambda api, r: api.create_job(r.get("parent", ""), r.get("job", {})),
    ),
    "UpdateJob": (
        scheduler_v1.UpdateJobRequest.pb(),
        _JOB,
        lambda api, r: api.update_job(
            r.get("job", {}).get("name", ""), r.get("job", {}), r.get("updateMask")
        ),
    ),
    "DeleteJob": (
        scheduler_v1.DeleteJobRequest.pb(),
        empty_pb2.Empty,
        lambda api, r: api.delete_job(r.get("name", "")),
    ),
    "PauseJob": (
        scheduler_v1.PauseJobRequest.pb(),
        _JOB,
        lambda api, r: api.pause_job(r.get("name", "")),
    ),
    "ResumeJob": (
        scheduler_v1.ResumeJobRequest.pb(),
        _JOB,
        lambda api, r: api.resume_job(r.get("name", "")),
    ),
    "RunJob": (
        scheduler_v1.RunJobRequest.pb(),
        _JOB,
        lambda api, r: api.run_job(r.get("name", "")),
    ),
}


def handler(api: SchedulerApi) -> grpc.GenericRpcHandler:
    """The CloudScheduler service's handler, for the emulator's gRPC server."""
    methods = {
        name: unary_method(api, request, response, handle)
        for name, (request, response, handle) in _METHODS.items()
    }
    return grpc.method_handlers_generic_handler(SERVICE, methods)
