"""The API's errors: a google.rpc status, and the HTTP code REST answers it with.

The HTTP code of each status is google.rpc's own mapping (the comments of
google/rpc/code.proto; google.api_core.exceptions maps them the same way): FAILED_PRECONDITION
and OUT_OF_RANGE are 400 like INVALID_ARGUMENT, ABORTED is 409 like ALREADY_EXISTS. So the
REST transport of Google's clients raises what it raises against the real service
(``BadRequest`` for FAILED_PRECONDITION, not ``PreconditionFailed``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from tasklease.errors import TaskleaseError

HTTP_OF_STATUS = {
    "OK": 200,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "UNAUTHENTICATED": 401,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
}


class ApiError(TaskleaseError):
    """An error the REST API answers in Google's JSON error shape. ``code`` stands for the
    status when none is given (400, 404, 409); with a status, the HTTP code is the
    status's own."""

    STATUS_OF_CODE: ClassVar[dict[int, str]] = {
        400: "INVALID_ARGUMENT",
        404: "NOT_FOUND",
        409: "ALREADY_EXISTS",
        412: "FAILED_PRECONDITION",
        500: "INTERNAL",
        501: "UNIMPLEMENTED",
    }

    def __init__(self, code: int, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status or self.STATUS_OF_CODE.get(code, "UNKNOWN")
        self.code = HTTP_OF_STATUS.get(self.status, code)

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "status": self.status}}
