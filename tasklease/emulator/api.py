"""The Cloud Tasks v2 API (the subset ``google-cloud-tasks`` and gcloud use), transport-free.

:class:`CloudTasksApi` takes and returns REST JSON (camelCase protobuf JSON) and raises
:class:`~tasklease.emulator.model.ApiError`; :mod:`tasklease.emulator.rest` serves it over HTTP and
:mod:`tasklease.emulator.grpc_api` over gRPC, so both share one model and one database.
"""

from __future__ import annotations

import base64
import random
import time
from collections.abc import Sequence
from typing import Any

from google.cloud import tasks_v2

from tasklease.emulator import locations, model
from tasklease.emulator.db import EmulatorDB
from tasklease.emulator.dispatcher import Dispatcher
from tasklease.emulator.field_masks import UpdateMask
from tasklease.emulator.model import ApiError
from tasklease.emulator.oidc import TokenIssuer
from tasklease.emulator.rows import TaskRow

CERTS_PATH = "/oauth2/v1/certs"  # The emulator's OIDC keys (served by emulator.rest).
# ListQueues and ListTasks: "If unspecified, the page size will be the maximum" (v2 docs);
# a larger size is coerced to the maximum (AIP-158), a negative one is INVALID_ARGUMENT.
MAX_QUEUES_PAGE, MAX_TASKS_PAGE = 9800, 1000
DEFAULT_QUEUE_REUSE_WINDOW = 7 * 86_400.0  # Cloud Tasks: a deleted queue's name, 7 days.
# Cloud Tasks' own messages, for a name that is taken or recently gone.
TASK_EXISTS = "Requested entity already exists"
TASK_TOO_RECENT = (
    "The task cannot be created because a task with this name existed too recently. For more "
    "information about task de-duplication see https://cloud.google.com/tasks/docs/reference/"
    "rest/v2/projects.locations.queues.tasks/create#body.request_body.FIELDS.task."
)
TASK_GONE = (
    "The task no longer exists, though a task with this name existed recently. "
    "The task either successfully completed or was deleted."
)
QUEUE_MISSING = "Queue does not exist."
QUEUE_GONE = "The queue no longer exists, though a queue with this name existed recently."
QUEUE_TOO_RECENT = (
    "The queue cannot be created because a queue with this name existed too recently."
)
# Output-only Queue fields: ignored on create and update, as the real service does.
_QUEUE_OUTPUT_ONLY = ("state", "purgeTime", "stats")
_QUEUE_FIXED = ("name", *_QUEUE_OUTPUT_ONLY)  # What an UpdateQueue's mask cannot change.
_QUEUE_MESSAGE = tasks_v2.Queue.pb().DESCRIPTOR  # The fields a mask may name.
_QUEUE_FILTERS = {"state: PAUSED": "PAUSED", "state: RUNNING": "RUNNING"}


class CloudTasksApi:
    """Request handling on top of the emulator's database and dispatcher."""

    def __init__(
        self,
        db: EmulatorDB,
        dispatcher: Dispatcher,
        issuer: TokenIssuer,
        dedup_window: float,
        queue_reuse_window: float = DEFAULT_QUEUE_REUSE_WINDOW,
    ) -> None:
        self.db = db
        self.dispatcher = dispatcher
        self.issuer = issuer
        self.dedup_window = dedup_window
        self.queue_reuse_window = queue_reuse_window

    # Locations.
    def list_locations(self, project: str) -> dict[str, Any]:
        return {"locations": locations.list_locations(project)}

    def get_location(self, project: str, location_id: str) -> dict[str, Any]:
        _check_region(location_id)
        return locations.location(project, location_id)

    # Queues.
    def create_queue(self, parent: str, body: dict[str, Any]) -> dict[str, Any]:
        _check_region(parent.rsplit("/", 1)[-1])
        name = body.get("name", "")
        if not name.startswith(parent + "/queues/"):
            raise ApiError(400, f"queue.name must be {parent}/queues/QUEUE_ID, not {name!r}")
        now_us = _now_us()
        if self.db.get_queue(name) is not None:
            raise ApiError(409, f"queue {name} already exists")
        if self.db.queue_deleted_since(name, now_us - int(self.queue_reuse_window * 1e6)):
            raise ApiError(412, QUEUE_TOO_RECENT, "FAILED_PRECONDITION")
        settings = {k: v for k, v in body.items() if k != "name" and k not in _QUEUE_OUTPUT_ONLY}
        config = model.parse_queue(name, settings)
        self.db.put_queue(name, config, now_us)
        self.dispatcher.wake()
        return config

    def list_queues(
        self, parent: str, page_size: int = 0, page_token: str = "", filter_: str = ""
    ) -> dict[str, Any]:
        _check_region(parent.rsplit("/", 1)[-1])
        queues = self.db.list_queues(parent)
        if filter_.strip():
            state = _QUEUE_FILTERS.get(" ".join(filter_.replace(":", ": ").split()))
            if state is None:
                raise ApiError(400, f"unsupported filter {filter_!r}: only 'state: PAUSED'")
            queues = [queue for queue in queues if queue.get("state") == state]
        page, token = _page(queues, page_size, page_token)
        result: dict[str, Any] = {"queues": page} if page else {}
        if token:
            result["nextPageToken"] = token
        return result

    def get_queue(self, name: str) -> dict[str, Any]:
        config = self.db.get_queue(name)
        if config is None:
            raise ApiError(404, f"queue {name} not found")
        return config

    def update_queue(self, name: str, body: dict[str, Any], mask: str | None) -> dict[str, Any]:
        """UpdateQueue, which creates the queue when it does not exist (Cloud Tasks v2)."""
        if body.get("name", name) != name:
            raise ApiError(400, "queue.name cannot be changed")
        fields = UpdateMask(mask, body, message=_QUEUE_MESSAGE, fixed=_QUEUE_FIXED)
        current = self.db.get_queue(name)
        if current is None:
            config = model.merge_queue(model.parse_queue(name, {}), fields)
            config = {k: v for k, v in config.items() if k not in _QUEUE_OUTPUT_ONLY}
            return self.create_queue(name.rsplit("/queues/", 1)[0], config)
        if fields.changes_nothing:
            return current
        config = model.merge_queue(current, fields)
        config["state"] = current["state"]
        if "purgeTime" in current:
            config["purgeTime"] = current["purgeTime"]
        self.db.put_queue(name, config, _now_us())
        self.dispatcher.wake()
        return config

    def change_queue(self, name: str, verb: str) -> dict[str, Any]:
        """``pause``, ``resume`` or ``purge``."""
        config = self.get_queue(name)
        if verb == "purge":
            self.db.purge_queue(name, _now_us())
            config["purgeTime"] = model.rfc3339(_now_us())
        else:
            config["state"] = "PAUSED" if verb == "pause" else "RUNNING"
        self.db.put_queue(name, config, _now_us())
        self.dispatcher.wake()
        return config

    def delete_queue(self, name: str) -> dict[str, Any]:
        self.db.delete_queue(self.get_queue(name)["name"], _now_us())
        return {}

    # IAM: stored and returned, never enforced (the emulator authorises every caller).
    def get_iam_policy(self, resource: str) -> dict[str, Any]:
        self.get_queue(resource)
        return self.db.get_policy(resource) or {"version": 1, "etag": _etag(0)}

    def set_iam_policy(self, resource: str, body: dict[str, Any]) -> dict[str, Any]:
        current = self.get_iam_policy(resource)
        policy = body.get("policy")
        if not isinstance(policy, dict):
            raise ApiError(400, "setIamPolicy needs a policy")
        # An etag from an older read means a concurrent change: IAM answers ABORTED.
        if policy.get("etag") and policy["etag"] != current["etag"]:
            raise ApiError(409, "There were concurrent policy changes.", "ABORTED")
        stored = {k: v for k, v in policy.items() if k in ("version", "bindings", "auditConfigs")}
        stored["etag"] = _etag(int.from_bytes(base64.b64decode(current["etag"]), "big") + 1)
        stored.setdefault("version", 1)
        self.db.put_policy(resource, stored)
        return stored

    def test_iam_permissions(self, resource: str, body: dict[str, Any]) -> dict[str, Any]:
        self.get_queue(resource)
        permissions = [p for p in body.get("permissions", []) if isinstance(p, str)]
        return {"permissions": permissions} if permissions else {}

    # Tasks.
    def create_task(self, queue: str, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` is a CreateTaskRequest: ``{"task": {...}, "responseView": ...}``."""
        self.check_queue_for_task(queue)
        now_us = _now_us()
        row, view = self._insert_task(queue, *model.parse_new_task(queue, body, now_us), now_us)
        return task_view(row, view)

    def create_task_message(self, request: Any) -> tuple[TaskRow, str]:
        """CreateTask for a CreateTaskRequest message (gRPC): the stored row and the view,
        without a round trip through JSON for the request."""
        queue = request.parent
        self.check_queue_for_task(queue)
        now_us = _now_us()
        spec, view = model.parse_create_task_request(queue, request, now_us)
        return self._insert_task(queue, spec, view, now_us)

    def create_tasks(
        self, queue: str, bodies: Sequence[dict[str, Any]]
    ) -> list[dict[str, Any] | ApiError]:
        """CreateTask for each of ``bodies`` (CreateTaskRequests) in order, stored in one
        change: each answer is the created task's view, or the ApiError CreateTask raises."""
        self.check_queue_for_task(queue)
        now_us = _now_us()
        answers: list[dict[str, Any] | ApiError] = []
        pending: list[tuple[int, TaskRow, str]] = []
        for index, body in enumerate(bodies):
            try:
                spec, view = model.parse_new_task(queue, body, now_us)
            except ApiError as exc:
                answers.append(exc)
                continue
            answers.append({})
            pending.append((index, self._new_row(queue, spec, now_us), view))
        since_us = now_us - int(self.dedup_window * 1_000_000)
        inserted = self.db.insert_tasks([row for _, row, _ in pending], since_us)
        for (index, row, view), stored in zip(pending, inserted, strict=True):
            answers[index] = task_view(row, view) if stored else self._name_taken(row.name)
        if any(inserted):
            self.dispatcher.wake()
        return answers

    def check_queue_for_task(self, queue: str) -> None:
        """CreateTask needs its queue: FAILED_PRECONDITION when it is missing, as in Cloud
        Tasks (NOT_FOUND is for the task itself)."""
        if self.db.has_queue(queue):
            return
        since_us = _now_us() - int(self.queue_reuse_window * 1e6)
        gone = self.db.queue_deleted_since(queue, since_us)
        raise ApiError(412, QUEUE_GONE if gone else QUEUE_MISSING, "FAILED_PRECONDITION")

    def _insert_task(
        self, queue: str, spec: dict[str, Any], view: str, now_us: int
    ) -> tuple[TaskRow, str]:
        row = self._new_row(queue, spec, now_us)
        # A name is taken while the task exists and for dedup_window after it ran or went.
        if not self.db.insert_task(row, now_us - int(self.dedup_window * 1_000_000)):
            raise self._name_taken(row.name)
        self.dispatcher.wake()
        return row, view

    @staticmethod
    def _new_row(queue: str, spec: dict[str, Any], now_us: int) -> TaskRow:
        """The row of a new task: a generated name if it has none, its schedule time at
        least now."""
        if not spec.get("name"):
            # Like Cloud Tasks' own generated IDs: numeric, not sequential.
            spec["name"] = f"{queue}/tasks/{random.getrandbits(63)}"
        # A schedule time in the past means now, as in Cloud Tasks.
        sent_us = model.micros_of(spec["scheduleTime"]) if spec.get("scheduleTime") else now_us
        schedule_us = max(now_us, sent_us)
        spec["scheduleTime"] = model.rfc3339(schedule_us)
        spec.setdefault("dispatchDeadline", model.duration(model.DEFAULT_DISPATCH_DEADLINE))
        return TaskRow(
            spec["name"], queue, spec, schedule_us, now_us, 0, 0,
            None, None, None, None, None, in_flight=False,
        )  # fmt: skip

    def _name_taken(self, name: str) -> ApiError:
        exists = self.db.get_task(name) is not None
        return ApiError(409, TASK_EXISTS if exists else TASK_TOO_RECENT)

    def list_tasks(
        self, queue: str, page_size: int = 0, page_token: str = "", view: str | int = "BASIC"
    ) -> dict[str, Any]:
        self.get_queue(queue)
        size, offset = _page_bounds(page_size, page_token, MAX_TASKS_PAGE)
        rows = self.db.list_tasks(queue, size + 1, offset)
        if not rows:
            return {}
        result: dict[str, Any] = {"tasks": [task_view(r, view) for r in rows[:size]]}
        if len(rows) > size:
            result["nextPageToken"] = str(offset + size)
        return result

    def get_task(self, name: str, view: str | int = "BASIC") -> dict[str, Any]:
        return task_view(self._task(name), view)

    def delete_task(self, name: str) -> dict[str, Any]:
        if not self.db.delete_task(name, _now_us()):
            self._task(name)  # Raises the real service's NOT_FOUND.
            raise ApiError(404, f"task {name} not found")
        return {}

    def run_task(self, name: str, view: str | int = "BASIC") -> dict[str, Any]:
        """Dispatch now, whatever the schedule or queue state; a task being dispatched is
        dispatched again as soon as its current attempt ends (unless that one succeeds)."""
        row = self._task(name)
        self.dispatcher.run_now(name)
        return task_view(row, view)

    def _task(self, name: str) -> TaskRow:
        row = self.db.get_task(name)
        if row is not None:
            return row
        since_us = _now_us() - int(self.dedup_window * 1_000_000)
        if self.db.task_tombstoned_since(name, since_us):
            raise ApiError(404, TASK_GONE)
        raise ApiError(404, f"task {name} not found")


def task_view(row: TaskRow, view: str | int) -> dict[str, Any]:
    """A stored task as the API returns it, in the BASIC or FULL view."""
    runtime = {
        "createTime": model.rfc3339(create_second_us(row)),
        "scheduleTime": model.rfc3339(row.schedule_us),
        "dispatchCount": row.dispatch_count,
        "responseCount": row.response_count,
        "firstAttempt": row.first_attempt,
        "lastAttempt": row.last_attempt,
    }
    return model.task_view(row.spec, runtime, "FULL" if view in ("FULL", 2, "2") else "BASIC")


def create_second_us(row: TaskRow) -> int:
    """The task's create time as Cloud Tasks shows it: truncated to the second."""
    return row.create_us - row.create_us % 1_000_000


def _etag(version: int) -> str:
    return base64.b64encode(version.to_bytes(8, "big")).decode()


def _check_region(location_id: str) -> None:
    if not locations.is_region(location_id):
        raise ApiError(400, f"Location {location_id!r} is not a Cloud region (e.g. us-central1)")


def _page_bounds(page_size: int | str, page_token: str, maximum: int) -> tuple[int, int]:
    try:
        size = int(page_size or 0)
        offset = int(page_token or 0)
    except ValueError as exc:
        raise ApiError(400, f"invalid pageSize or pageToken: {exc}") from exc
    if size < 0 or offset < 0:
        raise ApiError(400, "pageSize and pageToken must not be negative")
    return min(size or maximum, maximum), offset


def _page(items: list[dict[str, Any]], page_size: int, page_token: str) -> tuple[list[Any], str]:
    size, offset = _page_bounds(page_size, page_token, MAX_QUEUES_PAGE)
    page = items[offset : offset + size]
    return page, str(offset + size) if len(items) > offset + size else ""


def _now_us() -> int:
    return time.time_ns() // 1000
