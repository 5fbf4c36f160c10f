"""BatchCreateTasks (Cloud Tasks v2) and the long-running operations it answers with.

What google-cloud-tasks documents (``BatchCreateTasksRequest``, ``BatchCreateTasksMetadata``,
``BatchCreateTasksResponse``; the v2beta3 proto adds "This call is not atomic"):

- at most 100 CreateTaskRequests, all for the batch's queue, which must already exist;
- the operation's response lists "the tasks that were successfully created"; its metadata
  maps the index of each failed request to its error status (``failed_requests``), with state
  SUCCEEDED when every task was created and PARTIALLY_SUCCEEDED otherwise;
- ``request_id`` identifies the operation, "avoiding duplication when user retries".

Not documented, chosen here as closest to CreateTask: each request is one CreateTask, in
order, with CreateTask's validation and errors (a taken name is ALREADY_EXISTS in
``failed_requests``, a later duplicate inside the batch too); a batch-level fault (a missing
queue, more than 100 requests, another queue's request) fails the whole call as CreateTask
would; when every request fails the operation also carries ``error`` ABORTED, as
BatchDeleteTasks documents for the same case. The emulator creates the tasks before it answers,
so the operation is already done; it is kept (in the emulator's database) for GetOperation and
for a retry with the same ``request_id``, which answers the first operation without creating
anything again.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import grpc
from google.cloud import tasks_v2
from google.longrunning import operations_pb2  # type: ignore[import-untyped]

from tasklease.emulator import model
from tasklease.emulator.api import CloudTasksApi
from tasklease.emulator.db import EmulatorDB
from tasklease.emulator.grpc_api import SERVICE as TASKS_SERVICE
from tasklease.emulator.grpc_api import unary_method
from tasklease.emulator.model import ApiError

MAX_BATCH = 100
_LOCK_STRIPES = 64
OPERATIONS_SERVICE = "google.longrunning.Operations"
_TYPES = "type.googleapis.com/google.cloud.tasks.v2."
ALL_FAILED = (
    "None of the requests succeeded, refer to BatchCreateTasksMetadata.failed_requests for "
    "individual error details"
)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS operations (
    name TEXT PRIMARY KEY,
    request_key TEXT UNIQUE,
    operation TEXT NOT NULL
)
"""


class BatchApi:
    """BatchCreateTasks and GetOperation, as REST JSON, on top of :class:`CloudTasksApi`."""

    def __init__(self, api: CloudTasksApi, db: EmulatorDB) -> None:
        self.api = api
        self.db = db
        # Batches of one request_id one at a time (one of these striped locks per id), so a
        # retry finds the first one's answer; other batches run side by side, their creates
        # sharing commits.
        self._locks = [threading.Lock() for _ in range(_LOCK_STRIPES)]
        with db.transaction() as connection:
            connection.execute(_SCHEMA)

    def batch_create_tasks(self, parent: str, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` is a BatchCreateTasksRequest; the answer an Operation, already done."""
        requests = body.get("requests") or []
        if not isinstance(requests, list) or not requests:
            raise ApiError(400, "requests is required: 1 to 100 CreateTaskRequests")
        if len(requests) > MAX_BATCH:
            raise ApiError(400, f"A batch holds at most {MAX_BATCH} requests, not {len(requests)}")
        for index, request in enumerate(requests):
            if not isinstance(request, dict) or request.get("parent", parent) not in ("", parent):
                raise ApiError(400, f"requests[{index}].parent must be the batch's {parent}")
        request_id = str(body.get("requestId") or "")
        key = f"{parent}\n{request_id}" if request_id else None
        if key is None:
            return self._run(parent, requests, None)
        with self._locks[hash(key) % _LOCK_STRIPES]:
            return self._find("request_key", key) or self._run(parent, requests, key)

    def _run(self, parent: str, requests: list[Any], key: str | None) -> dict[str, Any]:
        self.api.check_queue_for_task(parent)
        start_us = _now_us()
        tasks: list[dict[str, Any]] = []
        failed: dict[str, dict[str, Any]] = {}
        answers = self.api.create_tasks(parent, [{**r, "parent": parent} for r in requests])
        for index, answer in enumerate(answers):
            if isinstance(answer, ApiError):
                failed[str(index)] = {"code": _rpc_code(answer.status), "message": answer.message}
            else:
                tasks.append(answer)
        location = parent.rsplit("/queues/", 1)[0]
        operation: dict[str, Any] = {
            "name": f"{location}/operations/{uuid.uuid4().hex}",
            "metadata": {
                "@type": _TYPES + "BatchCreateTasksMetadata",
                "startTime": model.rfc3339(start_us),
                "endTime": model.rfc3339(_now_us()),
                "state": "PARTIALLY_SUCCEEDED" if failed else "SUCCEEDED",
                **({"failedRequests": failed} if failed else {}),
            },
            "done": True,
        }
        if tasks:
            operation["response"] = {"@type": _TYPES + "BatchCreateTasksResponse", "tasks": tasks}
        else:
            operation["error"] = {"code": grpc.StatusCode.ABORTED.value[0], "message": ALL_FAILED}
        with self.db.transaction() as connection:
            connection.execute(
                "INSERT INTO operations (name, request_key, operation) VALUES (?, ?, ?)",
                (operation["name"], key, json.dumps(operation)),
            )
        return operation

    def get_operation(self, name: str) -> dict[str, Any]:
        operation = self._find("name", name)
        if operation is None:
            raise ApiError(404, f"Operation {name} not found.")
        return operation

    def _find(self, column: str, value: str) -> dict[str, Any] | None:
        with self.db.transaction() as connection:
            row = connection.execute(
                f"SELECT operation FROM operations WHERE {column} = ?",  # noqa: S608 (fixed)
                (value,),
            ).fetchone()
        return json.loads(row[0]) if row else None


def grpc_handlers(batch: BatchApi) -> list[grpc.GenericRpcHandler]:
    """BatchCreateTasks beside the other Cloud Tasks methods, and GetOperation."""
    create = unary_method(
        batch,
        tasks_v2.BatchCreateTasksRequest.pb(),
        operations_pb2.Operation,
        lambda api, r: api.batch_create_tasks(r.get("parent", ""), r),
    )
    get = unary_method(
        batch,
        operations_pb2.GetOperationRequest,
        operations_pb2.Operation,
        lambda api, r: api.get_operation(r.get("name", "")),
    )
    return [
        grpc.method_handlers_generic_handler(TASKS_SERVICE, {"BatchCreateTasks": create}),
        grpc.method_handlers_generic_handler(OPERATIONS_SERVICE, {"GetOperation": get}),
    ]


def _rpc_code(status: str) -> int:
    try:
        return int(grpc.StatusCode[status].value[0])
    except KeyError:
        return int(grpc.StatusCode.UNKNOWN.value[0])


def _now_us() -> int:
    return time.time_ns() // 1000
