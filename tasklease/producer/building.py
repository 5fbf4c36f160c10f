"""What :class:`~tasklease.producer.Producer` and :class:`~tasklease.producer.AsyncProducer`
share: their settings (from arguments or the environment) and the building of each task
request, validated before any network call. No I/O here: the two differ only in how a
request reaches the queue."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, Protocol, TypedDict, TypeVar

from tasklease import joins
from tasklease.producer import tracing
from tasklease.producer.errors import InvalidTask
from tasklease.producer.naming import random_task_id, task_id
from tasklease.producer.results import EnqueueResult, FanOutIncomplete
from tasklease.producer.retry import RetryPolicy
from tasklease.producer.transport import TaskRequest
from tasklease.protocol import (
    FAN_IN_HEADER,
    FAN_IN_OF_HEADER,
    LARGE_TASK_BYTES,
    LOCATION_HEADER,
    MAX_HEADER_VALUE_LENGTH,
    MAX_TASK_BYTES,
    PARENT_HEADER,
    PROJECT_HEADER,
    SCHEDULER_ROUTE_PREFIX,
    TASK_ROUTE_PREFIX,
)

_log = logging.getLogger("tasklease.producer")

# Platform limits (docs/platform-facts.md); the task size limits are the protocol's.
MAX_SCHEDULE_AHEAD = timedelta(days=30)
MIN_DISPATCH_DEADLINE = timedelta(seconds=15)
MAX_DISPATCH_DEADLINE = timedelta(minutes=30)
# Headers the producer sets itself; a caller may not override them.
_RESERVED_HEADER_PREFIXES = ("x-cloudtasks-", "x-appengine-", "x-cloudscheduler", "authorization")


class RunContext(Protocol):
    """What :meth:`Producer.fan_out` needs of the scheduled run: a
    ``tasklease.worker.TaskContext`` fits."""

    @property
    def run_id(self) -> str: ...


class TaskRoutes(Protocol):
    """What a producer given ``router=`` needs of it: a ``tasklease.worker.Router`` fits."""

    def has_task(self, name: str) -> bool: ...


class EnqueueOptions(TypedDict, total=False):
    """The options every enqueue call takes (see :meth:`Producer.enqueue`): ``delay`` or
    ``at`` (when the task runs), ``queue`` (else the producer's), ``dispatch_deadline`` (15 s
    to 30 min), ``headers`` (more task headers), ``route`` (the worker route the task
    targets: ``/tasks/``, the default, or ``/jobs/`` for a scheduled handler, as a scheduled
    run's ``continue_later`` does) and ``audience`` (its OIDC token's, else the producer's:
    for a handler that sets its own ``audience``, as ``continue_later`` does for it)."""

    delay: timedelta | None
    at: datetime | None
    queue: str | None
    dispatch_deadline: timedelta | None
    headers: Mapping[str, str] | None
    route: str
    audience: str | None


@dataclass(frozen=True)
class Options:
    """The per-call options of enqueue and enqueue_many."""

    delay: timedelta | None = None
    at: datetime | None = None
    queue: str | None = None
    dispatch_deadline: timedelta | None = None
    headers: Mapping[str, str] | None = None
    route: str = TASK_ROUTE_PREFIX
    audience: str | None = None


TransportT = TypeVar("TransportT")
SleepT = TypeVar("SleepT")


class TaskBuilder(Generic[TransportT, SleepT]):
    """The settings of a producer and the requests it builds from them; the subclass names
    its transport type and pause function (sync or async), and their defaults."""

    def __init__(
        self,
        project: str,
        location: str,
        queue: str = "default",
        worker_url: str = "",
        service_account: str | None = None,
        *,
        audience: str | None = None,
        transport: TransportT | None = None,
        tasks_endpoint: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 10.0,
        dispatch_deadline: timedelta | None = None,
        sleep: SleepT | None = None,
        batch: bool = True,
        router: TaskRoutes | None = None,
    ) -> None:
        if not project or not location or not queue:
            raise ValueError("project, location and queue are required")
        if not worker_url.startswith(("http://", "https://")):
            raise ValueError(f"worker_url must be an http(s) URL, not {worker_url!r}")
        self.project = project
        self.location = location
        self.queue = queue
        self.worker_url = worker_url.rstrip("/")
        self.service_account = service_account
        self.audience = audience or (self.worker_url if service_account else None)
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self.dispatch_deadline = _dispatch_deadline(dispatch_deadline)
        self.batch = batch
        self.router = router
        self.transport = transport or self._default_transport(tasks_endpoint)
        self._sleep = sleep or self._default_sleep()

    def _default_transport(self, tasks_endpoint: str | None) -> TransportT:
        """The Cloud Tasks transport (at ``tasks_endpoint``, a local emulator, if given)."""
        raise NotImplementedError

    def _default_sleep(self) -> SleepT:
        """How the producer pauses between tries."""
        raise NotImplementedError

    def queue_path(self, queue: str | None = None) -> str:
        return f"projects/{self.project}/locations/{self.location}/queues/{queue or self.queue}"

    def _build(
        self, task_name: str, payload: Any, key: str | None, options: Options
    ) -> TaskRequest:
        """Validate everything and build the request, before any network call."""
        if not task_name or not all(
            ch.isascii() and (ch.isalnum() or ch in "-_") for ch in task_name
        ):
            raise InvalidTask(f"task_name {task_name!r}: use letters, digits, '-' or '_'")
        if options.route not in (TASK_ROUTE_PREFIX, SCHEDULER_ROUTE_PREFIX):
            raise InvalidTask(
                f"route {options.route!r}: {TASK_ROUTE_PREFIX!r} or {SCHEDULER_ROUTE_PREFIX!r}"
            )
        routed = options.route == TASK_ROUTE_PREFIX
        if routed and self.router is not None and not self.router.has_task(task_name):
            raise InvalidTask(
                f"task_name {task_name!r}: the producer's router has no task handler of that "
                "name (a typo? enqueue by reference, handler.enqueue(...), cannot misspell it)"
            )
        if key is not None and (not isinstance(key, str) or not key):
            raise InvalidTask("key must be a non-empty string (or None for a random name)")
        try:
            body = json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidTask(f"payload is not JSON-serialisable: {exc}") from exc
        task_headers = {
            "Content-Type": "application/json",
            PROJECT_HEADER: self.project,
            LOCATION_HEADER: self.location,
            **tracing.trace_headers(),  # The caller's own headers below may replace them.
        }
        for name, value in (options.headers or {}).items():
            if not isinstance(name, str) or not isinstance(value, str):
                # The client library cannot send it; staged in an outbox, it would only fail
                # in the relay.
                raise InvalidTask(
                    f"header {name!r}: header names and values are text (str), "
                    f"not {type(value).__name__}"
                )
            if name.lower().startswith(_RESERVED_HEADER_PREFIXES):
                raise InvalidTask(f"header {name} is set by Cloud Tasks or the producer")
            task_headers[name] = value
        request = TaskRequest(
            queue_path=self.queue_path(options.queue),
            task_id=task_id(task_name, key) if key is not None else random_task_id(task_name),
            url=f"{self.worker_url}{options.route}{task_name}",
            body=body,
            headers=task_headers,
            service_account=self.service_account,
            audience=options.audience or self.audience,
            schedule_time=_schedule_time(options.delay, options.at),
            dispatch_deadline=_dispatch_deadline(options.dispatch_deadline)
            or self.dispatch_deadline,
        )
        size = _task_size(request)
        if size > MAX_TASK_BYTES:
            raise InvalidTask(
                f"task is {size} bytes, over Cloud Tasks' {MAX_TASK_BYTES}: store the payload "
                "elsewhere (GCS, Firestore) and enqueue a reference to it"
            )
        if size > LARGE_TASK_BYTES:
            _log.warning(
                "task %s is %d bytes: Cloud Tasks takes up to 1 MB (its quotas page), though its "
                "API reference still says %d; large payloads are better stored elsewhere",
                request.task_id,
                size,
                LARGE_TASK_BYTES,
            )
        return request

    def _build_many(
        self, task_name: str, items: Iterable[tuple[str, Any]], options: Options
    ) -> list[tuple[str | None, TaskRequest]]:
        """Every item's request, all validated before anything is sent."""
        return [(key, self._build(task_name, payload, key, options)) for key, payload in items]

    def _build_fan_in(
        self,
        ctx: RunContext,
        task_name: str,
        items: Sequence[tuple[str, Any]],
        then: str,
        options: Options,
    ) -> tuple[list[tuple[str | None, TaskRequest]], tuple[str, TaskRequest] | None]:
        """A fan-out with ``then=``: every child's request (each with its fan-in header), and
        for no items the ``then`` task's own (the join closes at once). All validated."""
        if self.router is not None and not self.router.has_task(then):
            raise InvalidTask(
                f"then {then!r}: the producer's router has no task handler of that name"
            )
        join, children = fan_in_plan(ctx, task_name, items, then)
        requests: list[tuple[str | None, TaskRequest]] = []
        for key, payload, header in children:
            merged = {**(options.headers or {}), **header}
            requests.append(
                (
                    key,
                    self._build(
                        task_name, payload, key, dataclasses.replace(options, headers=merged)
                    ),
                )
            )
        if children:
            return requests, None
        closing = dataclasses.replace(
            options, headers={**(options.headers or {}), FAN_IN_OF_HEADER: join}
        )
        key = joins.then_key(join)
        return [], (key, self._build(then, empty_fan_in_payload(ctx, join), key, closing))


def env_settings(environ: Mapping[str, str] | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A producer's constructor arguments from ``TASKLEASE_*`` variables, then ``overrides``
    (see :meth:`Producer.from_env`)."""
    env = os.environ if environ is None else environ
    missing = [
        name
        for name, value in [
            ("TASKLEASE_PROJECT", env.get("TASKLEASE_PROJECT") or env.get("GOOGLE_CLOUD_PROJECT")),
            ("TASKLEASE_LOCATION", env.get("TASKLEASE_LOCATION")),
            ("TASKLEASE_WORKER_URL", env.get("TASKLEASE_WORKER_URL")),
        ]
        if not value and name.split("_", 1)[1].lower() not in overrides
    ]
    if missing:
        raise ValueError(f"set {', '.join(missing)} to configure the producer")
    settings: dict[str, Any] = {
        "project": env.get("TASKLEASE_PROJECT") or env.get("GOOGLE_CLOUD_PROJECT"),
        "location": env.get("TASKLEASE_LOCATION"),
        "queue": env.get("TASKLEASE_QUEUE") or "default",
        "worker_url": env.get("TASKLEASE_WORKER_URL"),
        "service_account": env.get("TASKLEASE_SERVICE_ACCOUNT") or None,
        "audience": env.get("TASKLEASE_AUDIENCE") or None,
        "tasks_endpoint": env.get("TASKLEASE_TASKS_ENDPOINT") or None,
    }
    deadline = env.get("TASKLEASE_DISPATCH_DEADLINE")
    if deadline:
        settings["dispatch_deadline"] = timedelta(seconds=float(deadline))
    if env.get("TASKLEASE_BATCH", "").strip().lower() in ("0", "false", "no", "off"):
        settings["batch"] = False
    settings.update(overrides)
    return settings


def fan_out_items(ctx: RunContext, items: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """A fan-out's items, each key combined with the run's id."""
    return [(f"{ctx.run_id}/{item_key}", payload) for item_key, payload in items]


def parented(ctx: RunContext, options: Mapping[str, Any]) -> dict[str, Any]:
    """A plain fan-out's options, its children's headers naming the parent run
    (:data:`~tasklease.protocol.PARENT_HEADER`): a cancelled parent's pending children then
    never run."""
    return {**options, "headers": {**(options.get("headers") or {}), PARENT_HEADER: ctx.run_id}}


def fan_in_plan(
    ctx: RunContext, task_name: str, items: Sequence[tuple[str, Any]], then: str
) -> tuple[str, list[tuple[str, Any, dict[str, str]]]]:
    """A fan-out with ``then=``: its join id, and each child's key (from the join, so from
    the run), payload and fan-in header. Refuses item keys that repeat (the join would wait
    for a child that never comes) or are not text."""

    _check_handler_name("then", then)
    keys = [key for key, _ in items]
    seen: set[str] = set()
    for key in keys:
        if not isinstance(key, str) or not key:
            raise InvalidTask(f"fan-out item key {key!r}: item keys are non-empty strings")
        if key in seen:
            raise InvalidTask(
                f"fan-out item key {key!r} appears twice: a join counts one child per key"
            )
        seen.add(key)
    continuation = getattr(ctx, "continuation", 0)
    join = joins.join_id(
        ctx.run_id, continuation if isinstance(continuation, int) else 0, task_name, then, keys
    )
    members = joins.members(join, ctx.run_id, then, keys)
    for member in members:
        if len(member.header()) > MAX_HEADER_VALUE_LENGTH:
            raise InvalidTask(
                f"fan-out item key {member.key[:40]!r}...: with the run id it makes a "
                f"{FAN_IN_HEADER} header over {MAX_HEADER_VALUE_LENGTH} characters, which the "
                "worker refuses: use shorter keys (an id, or a hash of a long one)"
            )
    children = [
        (f"{join}/{key}", payload, {FAN_IN_HEADER: member.header()})
        for (key, payload), member in zip(items, members, strict=True)
    ]
    return join, children


def empty_fan_in_payload(ctx: RunContext, join: str) -> dict[str, Any]:
    """The ``then`` payload of a fan-out with no items: it closes as it opens."""
    return {
        "join_id": join,
        "parent_run_id": ctx.run_id,
        "summary": {"total": 0, "completed": 0, "failed": 0},
        "results": [],
        "next_after": None,
    }


def _check_handler_name(what: str, name: str) -> None:
    if not name or not all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in name):
        raise InvalidTask(f"{what} {name!r}: use letters, digits, '-' or '_'")


def fan_out_done(
    task_name: str, items: Sequence[tuple[str, Any]], results: Sequence[EnqueueResult]
) -> list[EnqueueResult]:
    """Count a fan-out's children and raise :class:`FanOutIncomplete` naming the item keys
    of those not created, if any."""
    tracing.fan_out_children(task_name, results)
    failed = [str(key) for (key, _), result in zip(items, results, strict=True) if not result.ok]
    if failed:
        raise FanOutIncomplete(results, failed)
    return list(results)


def _schedule_time(delay: timedelta | None, at: datetime | None) -> datetime | None:
    if delay is not None and at is not None:
        raise InvalidTask("give delay or at, not both")
    now = datetime.now(UTC)
    if delay is not None:
        if delay < timedelta(0):
            raise InvalidTask("delay must not be negative")
        at = now + delay
    if at is None:
        return None
    if at.tzinfo is None:
        raise InvalidTask("at must be timezone-aware (e.g. datetime.now(timezone.utc))")
    if at - now > MAX_SCHEDULE_AHEAD:
        raise InvalidTask(f"schedule time is more than {MAX_SCHEDULE_AHEAD.days} days ahead")
    return at.astimezone(UTC)


def _dispatch_deadline(deadline: timedelta | None) -> timedelta | None:
    if deadline is not None and not MIN_DISPATCH_DEADLINE <= deadline <= MAX_DISPATCH_DEADLINE:
        raise InvalidTask("dispatch_deadline must be between 15 seconds and 30 minutes")
    return deadline


def _task_size(request: TaskRequest) -> int:
    headers = sum(len(name) + len(value) for name, value in request.headers.items())
    return len(request.body) + headers + len(request.url) + len(request.name)
