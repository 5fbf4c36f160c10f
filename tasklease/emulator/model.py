"""Cloud Tasks resources as the REST API shows them: parsing, defaults, validation. Pure."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from typing import Any

from google.cloud import tasks_v2
from google.protobuf import duration_pb2, json_format

from tasklease.emulator import http_rules
from tasklease.emulator.errors import ApiError as ApiError  # noqa: PLC0414 - re-exported
from tasklease.emulator.field_masks import UpdateMask
from tasklease.emulator.policy import RetrySettings

# docs/platform-facts.md: queue IDs letters, digits, hyphens, <= 100; task IDs add
# underscores, <= 500.
QUEUE_NAME = re.compile(
    r"projects/([a-z0-9:.-]{1,100})/locations/([a-z0-9-]{1,63})/queues/([A-Za-z0-9-]{1,100})",
    re.ASCII,
)
TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,500}", re.ASCII)
# Cloud Tasks' maximum task size: 1 MB (cloud.google.com/tasks/docs/quotas, "Maximum task size";
# the v2 CreateTask proto comment still says 100 KB). Spelled here, not taken from the worker:
# the emulator is the oracle the worker is tested against.
MAX_TASK_BYTES = 1024 * 1024
MAX_SCHEDULE_AHEAD_SECONDS = 30 * 86_400
DEFAULT_DISPATCH_DEADLINE = 600.0
MIN_DISPATCH_DEADLINE, MAX_DISPATCH_DEADLINE = 15.0, 1800.0

# Defaults and limits of a queue (docs/platform-facts.md, "queue settings").
DEFAULT_RATE, MAX_RATE = 500.0, 500.0
DEFAULT_BURST = 100
DEFAULT_CONCURRENCY, MAX_CONCURRENCY = 1000, 5000
# How Cloud Tasks truncates what it stores (v2 Task and RetryConfig field docs; the backoffs'
# docs say "to the nearest second", yet the service keeps their default 0.1 s: milliseconds).
MILLISECOND_NS, SECOND_NS = 1_000_000, 1_000_000_000

_CREATE_TASK_REQUEST = tasks_v2.CreateTaskRequest.pb()  # The raw protobuf message class.

# How an HTTP answer shows up in an Attempt's response_status (google.rpc.Code).
_RPC_CODE_OF_HTTP = {
    400: 3,
    401: 16,
    403: 7,
    404: 5,
    409: 10,
    429: 8,
    499: 1,
    500: 13,
    501: 12,
    503: 14,
    504: 4,
}


def rfc3339(micros: int) -> str:
    moment = datetime.fromtimestamp(micros / 1e6, tz=UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def seconds_of(duration: str | None, default: float) -> float:
    """Seconds in a protobuf JSON Duration such as ``"0.100s"``."""
    if not duration:
        return default
    return float(duration.rstrip("s"))


def duration(seconds: float) -> str:
    return f"{seconds:.9f}".rstrip("0").rstrip(".") + "s"


def parse_queue(name: str, body: dict[str, Any] | None) -> dict[str, Any]:
    """A queue config with every default filled in, validated, as REST JSON."""
    if not QUEUE_NAME.fullmatch(name):
        raise ApiError(400, f"invalid queue name {name!r}: projects/P/locations/L/queues/Q")
    try:
        queue = tasks_v2.Queue.from_json(json.dumps(body or {}), ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError) as exc:
        raise ApiError(400, f"invalid queue: {exc}") from exc
    queue.name = name
    config = _to_dict(queue)
    # Proto3 JSON drops explicit zeros (maxDoublings: 0, minBackoff: "0s"): keep what was sent.
    for section in ("rateLimits", "retryConfig"):
        sent = (body or {}).get(section) or {}
        config.setdefault(section, {}).update({k: v for k, v in sent.items() if v in (0, "0s")})
    rate = config.setdefault("rateLimits", {})
    rate.setdefault("maxDispatchesPerSecond", DEFAULT_RATE)
    # Output only; Cloud Tasks derives it from the rate. Here: one second's worth, at most 100.
    rate["maxBurstSize"] = max(
        1, min(DEFAULT_BURST, math.ceil(float(rate["maxDispatchesPerSecond"])))
    )
    rate.setdefault("maxConcurrentDispatches", DEFAULT_CONCURRENCY)
    retry = config.setdefault("retryConfig", {})
    defaults = RetrySettings()
    retry.setdefault("maxAttempts", defaults.max_attempts)
    retry.setdefault("maxRetryDuration", duration(defaults.max_retry_duration))
    retry.setdefault("minBackoff", duration(defaults.min_backoff))
    retry.setdefault("maxBackoff", duration(defaults.max_backoff))
    retry.setdefault("maxDoublings", defaults.max_doublings)
    for key, unit in (("minBackoff", MILLISECOND_NS), ("maxBackoff", MILLISECOND_NS)):
        retry[key] = truncated(retry[key], unit)
    retry["maxRetryDuration"] = truncated(retry["maxRetryDuration"], SECOND_NS)
    config.setdefault("state", "RUNNING")
    _validate_queue(config)
    return config


def truncated(text: str, unit_ns: int) -> str:
    """A JSON Duration truncated to a multiple of ``unit_ns``, as the service stores it."""
    value = duration_pb2.Duration()
    try:
        value.FromJsonString(text)
    except ValueError as exc:
        raise ApiError(400, f"invalid duration {text!r}: {exc}") from exc
    nanos = value.ToNanoseconds()
    value.FromNanoseconds(nanos - nanos % unit_ns if nanos >= 0 else nanos)
    return str(value.ToJsonString())


def merge_queue(current: dict[str, Any], fields: UpdateMask) -> dict[str, Any]:
    """Apply an UpdateQueue's ``fields`` to the ``current`` queue, validated again."""
    merged = fields.apply(current)
    return parse_queue(current["name"], {k: v for k, v in merged.items() if k != "name"})


def retry_settings(config: dict[str, Any]) -> RetrySettings:
    retry = config["retryConfig"]
    return RetrySettings(
        max_attempts=int(retry["maxAttempts"]),
        max_retry_duration=seconds_of(retry.get("maxRetryDuration"), 0.0),
        min_backoff=seconds_of(retry.get("minBackoff"), 0.1),
        max_backoff=seconds_of(retry.get("maxBackoff"), 3600.0),
        max_doublings=int(retry["maxDoublings"]),
    )


def parse_new_task(queue: str, body: dict[str, Any], now_us: int) -> tuple[dict[str, Any], str]:
    """Validate a CreateTask body; return the task spec (REST JSON) and its response view.

    Parsed with the raw protobuf classes of google-cloud-tasks (not their proto-plus
    wrappers): the same validation, at a fraction of the CPU on the create path.
    """
    request = _CREATE_TASK_REQUEST()
    try:
        json_format.ParseDict(body, request, ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise ApiError(400, f"invalid CreateTaskRequest: {exc}") from exc
    return parse_create_task_request(queue, request, now_us)


def parse_create_task_request(queue: str, request: Any, now_us: int) -> tuple[dict[str, Any], str]:
    """:func:`parse_new_task` for a CreateTaskRequest message (as gRPC delivers it); the
    message's task loses its output-only fields."""
    task = request.task
    if task.HasField("app_engine_http_request"):
        raise ApiError(501, "the emulator serves HTTP targets only", "UNIMPLEMENTED")
    if not task.HasField("http_request") or not task.http_request.url:
        raise ApiError(400, "task.httpRequest.url is required")
    if not task.http_request.url.startswith(("http://", "https://")):
        raise ApiError(400, f"task.httpRequest.url must be http(s): {task.http_request.url}")
    http = task.http_request
    if http.HasField("oauth_token"):
        raise ApiError(501, "the emulator sends OIDC tokens, not OAuth tokens", "UNIMPLEMENTED")
    method = tasks_v2.HttpMethod(http.http_method or tasks_v2.HttpMethod.POST).name
    http_rules.check_request("task.httpRequest", http.url, method, http.headers, len(http.body))
    if task.name:
        prefix = f"{queue}/tasks/"
        if not task.name.startswith(prefix) or not TASK_ID.fullmatch(task.name[len(prefix) :]):
            raise ApiError(
                400,
                f"invalid task name {task.name!r}: {prefix}ID, ID of up to 500 "
                "letters, digits, hyphens or underscores",
            )
    if task.dispatch_deadline.nanos > 0:  # Cloud Tasks keeps it in milliseconds.
        task.dispatch_deadline.nanos -= task.dispatch_deadline.nanos % MILLISECOND_NS
    if task.ByteSize() > MAX_TASK_BYTES:
        raise ApiError(400, f"task is larger than the maximum task size ({MAX_TASK_BYTES} bytes)")
    for output_only in (
        "create_time",
        "dispatch_count",
        "response_count",
        "first_attempt",
        "last_attempt",
        "view",
    ):
        task.ClearField(output_only)
    spec: dict[str, Any] = json_format.MessageToDict(task)
    spec["httpRequest"].setdefault("httpMethod", "POST")  # UNSPECIFIED means POST.
    schedule = spec.get("scheduleTime")
    if schedule and micros_of(schedule) - now_us > MAX_SCHEDULE_AHEAD_SECONDS * 1_000_000:
        raise ApiError(400, "scheduleTime is more than 30 days in the future")
    deadline = seconds_of(spec.get("dispatchDeadline"), DEFAULT_DISPATCH_DEADLINE)
    if not MIN_DISPATCH_DEADLINE <= deadline <= MAX_DISPATCH_DEADLINE:
        raise ApiError(400, "dispatchDeadline must be between 15 seconds and 30 minutes")
    view = tasks_v2.Task.View(request.response_view or tasks_v2.Task.View.BASIC).name
    return spec, view


def task_view(spec: dict[str, Any], runtime: dict[str, Any], view: str = "BASIC") -> dict[str, Any]:
    """The Task resource as the API returns it; BASIC leaves out the body (the API's default)."""
    task: dict[str, Any] = json.loads(json.dumps(spec))
    task.update({key: value for key, value in runtime.items() if value is not None})
    task["view"] = view
    if view != "FULL":
        task.get("httpRequest", {}).pop("body", None)
    return task


def attempt(
    schedule_us: int, dispatch_us: int, response_us: int | None, status: int | None, message: str
) -> dict[str, Any]:
    """An Attempt resource."""
    code = 0 if status is not None and 200 <= status < 300 else _rpc_code(status)
    record: dict[str, Any] = {
        "scheduleTime": rfc3339(schedule_us),
        "dispatchTime": rfc3339(dispatch_us),
        "responseStatus": {"code": code, "message": message},
    }
    if response_us is not None:
        record["responseTime"] = rfc3339(response_us)
    return record


def micros_of(stamp: str) -> int:
    moment = datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", stamp.replace("Z", "+00:00")))
    return int(moment.timestamp() * 1_000_000)


def _rpc_code(status: int | None) -> int:
    if status is None:
        return 4  # DEADLINE_EXCEEDED or unreachable.
    return _RPC_CODE_OF_HTTP.get(status, 13 if status >= 500 else 9)


def _validate_queue(config: dict[str, Any]) -> None:
    _validate_http_target(config.get("httpTarget", {}))
    rate = config["rateLimits"]
    if not 0 < float(rate["maxDispatchesPerSecond"]) <= MAX_RATE:
        raise ApiError(400, f"rateLimits.maxDispatchesPerSecond must be in (0, {MAX_RATE}]")
    if not 0 < int(rate["maxConcurrentDispatches"]) <= MAX_CONCURRENCY:
        raise ApiError(400, f"rateLimits.maxConcurrentDispatches must be in (0, {MAX_CONCURRENCY}]")
    sampling = float(config.get("stackdriverLoggingConfig", {}).get("samplingRatio", 0.0))
    if not 0.0 <= sampling <= 1.0:
        raise ApiError(400, "stackdriverLoggingConfig.samplingRatio must be in [0.0, 1.0]")
    retry = retry_settings(config)
    if retry.max_attempts < -1 or retry.max_attempts == 0:
        raise ApiError(400, "retryConfig.maxAttempts must be -1 (unlimited) or positive")
    if retry.min_backoff > retry.max_backoff:
        raise ApiError(400, "retryConfig.minBackoff must not exceed maxBackoff")
    if retry.max_doublings < 0:
        raise ApiError(400, "retryConfig.maxDoublings must not be negative")


def _validate_http_target(target: dict[str, Any]) -> None:
    """The rules Cloud Tasks documents for a queue's HttpTarget; ApiError otherwise."""
    uri = target.get("uriOverride", {})
    if "host" in uri and not uri["host"]:
        raise ApiError(400, "httpTarget.uriOverride.host cannot be an empty string")
    if int(uri.get("port", 0)) < 0:
        raise ApiError(400, "httpTarget.uriOverride.port must be a positive integer")
    overrides = {
        str(o.get("header", {}).get("key", "")): str(o.get("header", {}).get("value", ""))
        for o in target.get("headerOverrides", [])
    }
    http_rules.check_headers("httpTarget.headerOverrides", overrides)
    if "oauthToken" in target:
        raise ApiError(501, "the emulator sends OIDC tokens, not OAuth tokens", "UNIMPLEMENTED")
    oidc = target.get("oidcToken")
    if oidc is not None and not (oidc.get("serviceAccountEmail") and oidc.get("audience")):
        raise ApiError(
            400, "httpTarget.oidcToken needs both serviceAccountEmail and audience on a queue"
        )


def _to_dict(message: Any) -> dict[str, Any]:
    text = type(message).to_json(
        message,
        use_integers_for_enums=False,
        indent=None,
        always_print_fields_with_no_presence=False,
    )
    result: dict[str, Any] = json.loads(text)
    return result
