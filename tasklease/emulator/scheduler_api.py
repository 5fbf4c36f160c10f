"""The Cloud Scheduler v1 API (what ``gcloud scheduler jobs`` uses), for HTTP-target jobs.

Jobs are validated through ``google-cloud-scheduler``'s own message class, kept as REST JSON in
the emulator's SQLite database (so they survive a restart) and handed to
:class:`~tasklease.emulator.scheduler.LocalScheduler`, which fires them on their schedule with their
retry config. ``run`` sends what Cloud Scheduler sends for a manual run: the next
scheduled time in ``X-CloudScheduler-ScheduleTime``, before that time.
"""

from __future__ import annotations

import base64
import logging
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from google.cloud import scheduler_v1
from google.protobuf import json_format

from tasklease.emulator import http_rules, locations, model, schedules
from tasklease.emulator.db import EmulatorDB
from tasklease.emulator.field_masks import UpdateMask
from tasklease.emulator.job_table import JobTable
from tasklease.emulator.model import ApiError
from tasklease.emulator.policy import RetrySettings
from tasklease.emulator.scheduler import (
    DEFAULT_ATTEMPT_DEADLINE,
    DEFAULT_JOB_RETRY,
    MAX_ATTEMPT_DEADLINE,
    MAX_RETRY_COUNT,
    MIN_ATTEMPT_DEADLINE,
    Job,
    LocalScheduler,
)

JOB_NAME = re.compile(
    r"projects/([a-z0-9:.-]{1,100})/locations/([a-z0-9-]{1,63})/jobs/([A-Za-z0-9_-]{1,500})",
    re.ASCII,
)
_JOB = scheduler_v1.Job.pb()  # The raw protobuf class: validation by Google's own schema.
# Output-only fields: ignored on create and update.
_OUTPUT_ONLY = ("state", "status", "userUpdateTime", "scheduleTime", "lastAttemptTime")
_FIXED = ("name", *_OUTPUT_ONLY)  # What an UpdateJob's mask cannot change.
_MAPS = ("headers",)  # HttpTarget.headers: a map, replaced whole.
# Cloud Scheduler's defaults (scheduler.DEFAULT_JOB_RETRY), as REST JSON fills them in.
_DEFAULT_RETRY = {
    "retryCount": DEFAULT_JOB_RETRY.max_attempts - 1,
    "maxRetryDuration": f"{DEFAULT_JOB_RETRY.max_retry_duration:g}s",
    "minBackoffDuration": f"{DEFAULT_JOB_RETRY.min_backoff:g}s",
    "maxBackoffDuration": f"{DEFAULT_JOB_RETRY.max_backoff:g}s",
    "maxDoublings": DEFAULT_JOB_RETRY.max_doublings,
}
_DEFAULT_DEADLINE = f"{DEFAULT_ATTEMPT_DEADLINE:g}s"
MAX_DESCRIPTION = 500  # Job.description: "must not contain more than 500 characters".
_log = logging.getLogger("tasklease.scheduler")


class SchedulerApi:
    """Create, read, change and run jobs; their firing is the scheduler's."""

    def __init__(self, db: EmulatorDB, scheduler: LocalScheduler) -> None:
        self.db = db
        self.jobs = JobTable(db)
        self.scheduler = scheduler
        scheduler.after_run = self._record_run

    def load(self) -> None:
        """Schedule every enabled job in the database (at start-up). A job stored with data
        the emulator cannot run (from before a check existed) is skipped and logged."""
        for spec in self.jobs.list(""):
            if spec.get("state") != "ENABLED":
                continue
            try:
                self.scheduler.add(job_of(spec))
            except Exception:
                _log.exception("cannot schedule the stored job %s; skipping it", spec.get("name"))

    def list_locations(self, project: str) -> dict[str, Any]:
        return {"locations": locations.list_locations(project)}

    def create_job(self, parent: str, body: dict[str, Any]) -> dict[str, Any]:
        _check_parent(parent)
        name = body.get("name", "")
        if not name.startswith(parent + "/jobs/") or not JOB_NAME.fullmatch(name):
            raise ApiError(
                400,
                f"job.name must be {parent}/jobs/JOB_ID, JOB_ID of up to 500 letters, digits, "
                f"hyphens or underscores, not {name!r}",
            )
        spec = parse_job(name, {k: v for k, v in body.items() if k not in _OUTPUT_ONLY})
        spec["state"] = "ENABLED"
        spec["userUpdateTime"] = model.rfc3339(_now_us())
        if not self.jobs.create(name, spec):
            raise ApiError(409, f"Job {name} already exists.")
        self.scheduler.add(job_of(spec))
        return self._view(spec)

    def list_jobs(self, parent: str, page_size: int = 0, page_token: str = "") -> dict[str, Any]:
        _check_parent(parent)
        jobs = [self._view(spec) for spec in self.jobs.list(parent + "/jobs/")]
        try:
            size, offset = min(int(page_size or 500), 500), int(page_token or 0)
        except ValueError as exc:
            raise ApiError(400, f"invalid pageSize or pageToken: {exc}") from exc
        result: dict[str, Any] = {"jobs": jobs[offset : offset + size]} if jobs else {}
        if len(jobs) > offset + size:
            result["nextPageToken"] = str(offset + size)
        return result

    def get_job(self, name: str) -> dict[str, Any]:
        return self._view(self._spec(name))

    def update_job(self, name: str, body: dict[str, Any], mask: str | None) -> dict[str, Any]:
        if body.get("name", name) != name:
            raise ApiError(400, "job.name cannot be changed")
        fields = UpdateMask(mask, body, message=_JOB.DESCRIPTOR, fixed=_FIXED, maps=_MAPS)

        def update(current: dict[str, Any]) -> dict[str, Any]:
            merged = fields.apply({k: v for k, v in current.items() if k not in _OUTPUT_ONLY})
            spec = parse_job(name, merged)
            spec["state"] = current["state"]
            spec["userUpdateTime"] = model.rfc3339(_now_us())
            for kept in ("status", "lastAttemptTime"):
                if kept in current:
                    spec[kept] = current[kept]
            return spec

        spec = self._change(name, update)
        if spec["state"] == "ENABLED":
            self.scheduler.add(job_of(spec))
        return self._view(spec)

    def pause_job(self, name: str) -> dict[str, Any]:
        """PauseJob: "If successful, the job's state will be PAUSED. A job must be in
        Job.State.ENABLED to be paused" (PauseJob's docs); FAILED_PRECONDITION otherwise."""
        return self._set_state(name, "PAUSED", required="ENABLED")

    def resume_job(self, name: str) -> dict[str, Any]:
        """ResumeJob: the job must be PAUSED (ResumeJob's docs); FAILED_PRECONDITION
        otherwise."""
        return self._set_state(name, "ENABLED", required="PAUSED")

    def delete_job(self, name: str) -> dict[str, Any]:
        if not self.jobs.delete(name):
            raise ApiError(404, f"Job not found: {name}")
        self.scheduler.remove(name)
        return {}

    def run_job(self, name: str) -> dict[str, Any]:
        """A manual run, paused or not: the scheduled time it carries is the next one."""
        spec = self._spec(name)
        self.scheduler.run(job_of(spec))
        return self._view(spec)

    def _set_state(self, name: str, state: str, *, required: str) -> dict[str, Any]:
        def change(spec: dict[str, Any]) -> dict[str, Any]:
            if spec.get("state") != required:
                raise ApiError(
                    400,
                    f"Job.state must be {required}, not {spec.get('state')}, for this call.",
                    "FAILED_PRECONDITION",
                )
            return {**spec, "state": state}

        spec = self._change(name, change)
        if state == "ENABLED":
            self.scheduler.add(job_of(spec))
        else:
            self.scheduler.remove(name)
        return self._view(spec)

    def _record_run(self, name: str, attempt_us: int, status: int | None) -> None:
        """Note a run's last attempt on its job, unless the job was deleted meanwhile."""

        def record(spec: dict[str, Any]) -> dict[str, Any]:
            spec["lastAttemptTime"] = model.rfc3339(attempt_us)
            if status is not None and 200 <= status < 300:
                spec.pop("status", None)
            else:
                code = model.attempt(attempt_us, attempt_us, None, status, "")["responseStatus"]
                spec["status"] = {"code": code["code"]}
            return spec

        self.jobs.change(name, record)

    def _spec(self, name: str) -> dict[str, Any]:
        spec = self.jobs.get(name)
        if spec is None:
            raise ApiError(404, f"Job not found: {name}")
        return spec

    def _change(
        self, name: str, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        spec = self.jobs.change(name, change)
        if spec is None:
            raise ApiError(404, f"Job not found: {name}")
        return spec

    @staticmethod
    def _view(spec: dict[str, Any]) -> dict[str, Any]:
        view = dict(spec)
        if spec.get("state") == "ENABLED":
            try:
                upcoming = job_of(spec).next_time(datetime.now(UTC))
            except Exception:  # Stored before its schedule was checked: shown, never fired.
                return view
            view["scheduleTime"] = upcoming.isoformat().replace("+00:00", "Z")
        return view


def parse_job(name: str, body: dict[str, Any]) -> dict[str, Any]:
    """A job's REST JSON, validated by the Job message and Cloud Scheduler's limits, with
    the service's defaults filled in."""
    try:
        job = json_format.ParseDict({**body, "name": name}, _JOB(), ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise ApiError(400, f"invalid job: {exc}") from exc
    if job.HasField("pubsub_target") or job.HasField("app_engine_http_target"):
        raise ApiError(501, "the emulator runs HTTP-target jobs only", "UNIMPLEMENTED")
    if not job.HasField("http_target") or not job.http_target.uri:
        raise ApiError(400, "job.httpTarget.uri is required")
    if not job.http_target.uri.startswith(("http://", "https://")):
        raise ApiError(400, f"job.httpTarget.uri must be http(s): {job.http_target.uri}")
    if job.http_target.HasField("oauth_token"):
        raise ApiError(501, "the emulator sends OIDC tokens, not OAuth tokens", "UNIMPLEMENTED")
    if len(job.description) > MAX_DESCRIPTION:
        raise ApiError(400, f"job.description must not exceed {MAX_DESCRIPTION} characters")
    target = job.http_target
    method = scheduler_v1.HttpMethod(target.http_method or scheduler_v1.HttpMethod.POST).name
    http_rules.check_request("job.httpTarget", target.uri, method, target.headers, len(target.body))
    spec: dict[str, Any] = json_format.MessageToDict(job)
    spec.setdefault("timeZone", "Etc/UTC")
    if not job.schedule:
        raise ApiError(400, "job.schedule is required")
    try:
        schedules.check(job.schedule, spec["timeZone"], datetime.now(UTC))
    except ValueError as exc:
        raise ApiError(400, f"Invalid schedule: {exc}") from exc
    spec["httpTarget"].setdefault("httpMethod", "POST")
    retry = spec.setdefault("retryConfig", {})
    for key, default in _DEFAULT_RETRY.items():
        retry.setdefault(key, (body.get("retryConfig") or {}).get(key, default))
    if not 0 <= int(retry["retryCount"]) <= MAX_RETRY_COUNT:
        raise ApiError(400, f"retryConfig.retryCount must be 0 to {MAX_RETRY_COUNT}")
    spec.setdefault("attemptDeadline", _DEFAULT_DEADLINE)
    deadline = model.seconds_of(spec["attemptDeadline"], DEFAULT_ATTEMPT_DEADLINE)
    if not MIN_ATTEMPT_DEADLINE <= deadline <= MAX_ATTEMPT_DEADLINE:
        raise ApiError(400, "attemptDeadline must be between 15 seconds and 30 minutes")
    return spec


def job_of(spec: dict[str, Any]) -> Job:
    """The scheduler's Job for a job's REST JSON."""
    target = spec["httpTarget"]
    oidc = target.get("oidcToken") or {}
    retry = spec["retryConfig"]
    return Job(
        name=spec["name"],
        schedule=spec["schedule"],
        url=target["uri"],
        time_zone=spec.get("timeZone", "Etc/UTC"),
        http_method=target.get("httpMethod", "POST"),
        body=base64.b64decode(target.get("body") or ""),
        headers=dict(target.get("headers") or {}),
        service_account=oidc.get("serviceAccountEmail"),
        audience=oidc.get("audience"),
        attempt_deadline=model.seconds_of(spec.get("attemptDeadline"), DEFAULT_ATTEMPT_DEADLINE),
        retry=RetrySettings(
            max_attempts=int(retry["retryCount"]) + 1,
            max_retry_duration=model.seconds_of(
                retry.get("maxRetryDuration"), DEFAULT_JOB_RETRY.max_retry_duration
            ),
            min_backoff=model.seconds_of(
                retry.get("minBackoffDuration"), DEFAULT_JOB_RETRY.min_backoff
            ),
            max_backoff=model.seconds_of(
                retry.get("maxBackoffDuration"), DEFAULT_JOB_RETRY.max_backoff
            ),
            max_doublings=int(retry["maxDoublings"]),
        ),
    )


def _check_parent(parent: str) -> None:
    location_id = parent.rsplit("/", 1)[-1]
    if not locations.is_region(location_id):
        raise ApiError(400, f"Location {location_id!r} is not a Cloud region (e.g. us-central1)")


def _now_us() -> int:
    return time.time_ns() // 1000
