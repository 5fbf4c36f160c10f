"""A stub queue and a stub scheduler that deliver to a Flask test client as Google does.

They back the pytest fixtures of :mod:`tasklease.testing`, and work without pytest too:

    queue = StubQueue()                  # queue.producer enqueues into it
    queue.bind(router)                   # and so does send_receipt.enqueue(...), until close()
    summary = queue.drain(app.test_client(), duplicate_every=3)
    StubScheduler().fire(client, "nightly", at=datetime(2026, 1, 1, 3, tzinfo=UTC))

Nothing here sleeps: retries follow at once, and a drain delivers every pending task whatever
its schedule time.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tasklease import cron, protocol
from tasklease.jobs import Job, parse_job, parse_jobs, read_tables
from tasklease.producer import AsyncProducer, MemoryTransport, Producer
from tasklease.producer.memory import AsyncMemoryTransport, QueuedTask
from tasklease.producer.producer import TaskRoutes
from tasklease.producer.transport import TaskRequest
from tasklease.worker.core import constants as c

if TYPE_CHECKING:
    from tasklease.worker.handlers.router import Router

PROJECT, LOCATION, QUEUE = "test-project", "us-central1", "default"
WORKER_URL = "http://worker.test"
DEFAULT_MAX_ATTEMPTS = 100  # Cloud Tasks' default for a queue.
# A drain that has not settled after this many attempts has handlers creating tasks forever.
DRAIN_LIMIT = 10_000


class Response(Protocol):
    """What the stubs read of a response (a Flask test client's fits)."""

    status_code: int
    headers: Mapping[str, str]

    def get_data(self) -> bytes: ...


class Client(Protocol):
    """A Flask test client, or anything with the same ``post``."""

    def post(self, path: str, *, headers: dict[str, str], data: bytes) -> Any: ...


@dataclass(frozen=True)
class Delivered:
    """One request sent to the worker, and how it ended.

    ``outcome`` is the worker's ``X-Tasklease-Outcome`` (``processed``, ``duplicate``,
    ``failed``, ``released``, ...); ``injected`` is ``"duplicate"`` for an injected second copy
    of a delivery and ``"lost_response"`` for a delivery whose answer the queue never got.
    """

    kind: str  # "task" or "scheduler"
    handler: str
    status: int
    outcome: str | None
    retry_count: int = 0
    task_id: str | None = None
    schedule_time: datetime | None = None
    injected: str | None = None
    body: bytes = b""

    def json(self) -> Any:
        """The response body as JSON (None when empty)."""
        return json.loads(self.body) if self.body else None


@dataclass(frozen=True)
class CreatedTask:
    """A task the producer created: its handler (the ``task_name`` it was enqueued under),
    ID, payload, and how its deliveries went so far."""

    handler: str
    task_id: str
    payload: Any
    schedule_time: datetime | None
    request: TaskRequest
    attempts: int
    done: bool  # Answered with a 2xx.
    given_up: bool = False  # Out of attempts without a 2xx.


# Outcomes of a delivery that executed its run: completed, failed for good (a dead letter),
# released after the handler raised, its lease lost while running, or ran but unrecorded.
EXECUTED = frozenset({"processed", "failed", "released", "lost_claim", "unrecorded"})


@dataclass
class DrainSummary:
    """Every delivery of one :meth:`StubQueue.drain`, in order."""

    deliveries: list[Delivered] = field(default_factory=list)
    given_up: list[str] = field(default_factory=list)  # Task IDs out of attempts.

    @property
    def outcomes(self) -> Counter[str]:
        """How many deliveries ended with each outcome, e.g. ``{"processed": 3}``."""
        return Counter(d.outcome or f"HTTP {d.status}" for d in self.deliveries)

    def executions(self, handler: str | None = None) -> int:
        """How many deliveries executed a run of ``handler`` (any, if None), however the
        execution ended: :data:`EXECUTED` outcomes. A duplicate, a delivery refused or
        answered ``in_progress`` ran nothing and is not counted; ``outcomes["processed"]``
        counts the completed ones alone."""
        return sum(d.outcome in EXECUTED and handler in (None, d.handler) for d in self.deliveries)


@dataclass
class _TaskState:
    created: float
    executions: int = 0  # Answers other than 5xx (X-CloudTasks-TaskExecutionCount).
    previous_response: int | None = None
    retry_reason: str | None = None
    given_up: bool = False


class StubQueue:
    """An in-memory Cloud Tasks queue: ``producer`` creates named tasks in it (a name seen
    before is refused, as Cloud Tasks does within its de-duplication window) and
    :meth:`drain` delivers them. With ``router=`` (or after :meth:`bind`), the producer
    refuses task names the router has no handler for."""

    def __init__(
        self,
        *,
        project: str = PROJECT,
        location: str = LOCATION,
        queue: str = QUEUE,
        worker_url: str = WORKER_URL,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        router: TaskRoutes | None = None,
    ) -> None:
        self.transport = MemoryTransport()
        self.producer = Producer(
            project,
            location,
            queue,
            worker_url,
            transport=self.transport,
            sleep=_no_sleep,
            router=router,
        )
        self.async_producer = AsyncProducer(
            project,
            location,
            queue,
            worker_url,
            transport=AsyncMemoryTransport(self.transport),
            sleep=_no_async_sleep,
            router=router,
        )
        self.max_attempts = max_attempts
        self._state: dict[str, _TaskState] = {}
        self._bound: list[tuple[Router, Producer | None, AsyncProducer | None]] = []

    def bind(self, router: Router) -> StubQueue:
        """Send ``router``'s enqueues by reference (``send_receipt.enqueue(...)`` and
        ``await send_receipt.aenqueue(...)``, from tests and from handlers the drain runs)
        into this queue until :meth:`close`, and refuse task names the router has no handler
        for."""
        self.producer.router = self.async_producer.router = router
        previous = router.use_producer(self.producer)
        self._bound.append((router, previous, router.use_async_producer(self.async_producer)))
        return self

    @property
    def tasks(self) -> list[CreatedTask]:
        """Every task created so far, in creation order."""
        return [self._view(task) for task in self.transport.tasks]

    def pending(self) -> list[CreatedTask]:
        """Tasks not yet answered with a 2xx, and not given up."""
        return [self._view(task) for task in self._due()]

    def drain(
        self,
        client: Client,
        duplicate_every: int = 0,
        lose_response_every: int = 0,
        *,
        limit: int = DRAIN_LIMIT,
    ) -> DrainSummary:
        """Deliver every pending task, and the tasks those create, until none is left.

        Each attempt carries the headers Cloud Tasks sends. A non-2xx answer is retried
        (after the other pending tasks), up to ``max_attempts`` per task. Every
        ``duplicate_every``-th attempt is also delivered a second time, and every
        ``lose_response_every``-th attempt's answer is dropped, so the task is retried although
        the handler ran: the two ways Cloud Tasks delivers a task more than once. Raises
        ``RuntimeError`` after ``limit`` attempts (handlers that keep creating new tasks).
        """
        summary = DrainSummary()
        attempt = 0
        while due := self._due():
            for task in sorted(due, key=self._eta):
                attempt += 1
                if attempt > limit:
                    raise RuntimeError(
                        f"drain did not settle after {limit} attempts: do handlers keep "
                        "creating tasks with new names?"
                    )
                headers = self._headers(task)
                lost = bool(lose_response_every and attempt % lose_response_every == 0)
                status, delivered = self._send(
                    client, task, headers, injected="lost_response" if lost else None
                )
                summary.deliveries.append(delivered)
                if duplicate_every and attempt % duplicate_every == 0:
                    _, twin = self._send(client, task, headers, injected="duplicate")
                    summary.deliveries.append(twin)
                self._record(task, None if lost else status)
                if not task.done and task.deliveries >= self.max_attempts:
                    self._state[task.request.name].given_up = True
                    summary.given_up.append(task.request.task_id)
        return summary

    def redeliver(self) -> None:
        """Make every task due again on the next :meth:`drain`, answered or given up: the
        delivery a queue makes later again (a duplicate, or a retry once a clock moved)."""
        for task in self.transport.tasks:
            task.done = False
            state = self._state.get(task.request.name)
            if state is not None:
                state.given_up = False

    def close(self) -> None:
        """Give each bound router back the producer it had, and close this one."""
        while self._bound:
            router, previous, previous_async = self._bound.pop()
            router.use_producer(previous)
            router.use_async_producer(previous_async)
        self.producer.close()

    def _due(self) -> list[QueuedTask]:
        due = []
        for task in self.transport.tasks:
            state = self._state.setdefault(task.request.name, _TaskState(created=time.time()))
            if not task.done and not state.given_up:
                due.append(task)
        return due

    def _eta(self, task: QueuedTask) -> float:
        scheduled = task.request.schedule_time
        return scheduled.timestamp() if scheduled else self._state[task.request.name].created

    def _headers(self, task: QueuedTask) -> dict[str, str]:
        request, state = task.request, self._state[task.request.name]
        headers = {
            **request.headers,
            "User-Agent": "Google-Cloud-Tasks",
            c.TASKS_QUEUE_NAME: request.queue_path.rsplit("/", 1)[-1],
            c.TASKS_TASK_NAME: request.task_id,
            c.TASKS_RETRY_COUNT: str(task.deliveries),
            c.TASKS_EXECUTION_COUNT: str(state.executions),
            c.TASKS_ETA: f"{self._eta(task) if not task.deliveries else time.time():.6f}",
        }
        if state.previous_response is not None:
            headers[c.TASKS_PREVIOUS_RESPONSE] = str(state.previous_response)
        if state.retry_reason:
            headers[c.TASKS_RETRY_REASON] = state.retry_reason
        return headers

    def _send(
        self, client: Client, task: QueuedTask, headers: dict[str, str], injected: str | None
    ) -> tuple[int, Delivered]:
        request = task.request
        response = client.post(_path(request.url), headers=headers, data=request.body)
        delivered = Delivered(
            "task",
            _path(request.url).rsplit("/", 1)[-1],
            response.status_code,
            response.headers.get(protocol.OUTCOME_HEADER),
            retry_count=task.deliveries,
            task_id=request.task_id,
            schedule_time=request.schedule_time,
            injected=injected,
            body=response.get_data(),
        )
        return response.status_code, delivered

    def _record(self, task: QueuedTask, status: int | None) -> None:
        """One attempt's result as the queue saw it (None: no answer reached it)."""
        state = self._state[task.request.name]
        task.deliveries += 1
        if status is not None and status < 500:
            state.executions += 1
        task.done = status is not None and 200 <= status < 300
        state.previous_response = status
        state.retry_reason = None if task.done else (f"HTTP {status}" if status else "no answer")

    def _view(self, task: QueuedTask) -> CreatedTask:
        request = task.request
        state = self._state.get(request.name)
        return CreatedTask(
            handler=_path(request.url).rsplit("/", 1)[-1],
            task_id=request.task_id,
            payload=json.loads(request.body) if request.body else None,
            schedule_time=request.schedule_time,
            request=request,
            attempts=task.deliveries,
            done=task.done,
            given_up=bool(state and state.given_up),
        )


class StubScheduler:
    """Sends Cloud Scheduler deliveries to a Flask test client: a slot's run, or a manual one."""

    def __init__(self, jobs: list[Job] | None = None) -> None:
        self.jobs: dict[str, Job] = {}
        self._tables: list[Any] = []  # Those of load(), over the jobs of bind().
        self._source = ""
        for job in jobs or []:
            self._add(job)

    def add_job(self, name: str, schedule: str, time_zone: str = "Etc/UTC") -> Job:
        table = {"name": name, "schedule": schedule, "time_zone": time_zone}
        return self._add(parse_job(table))

    def load(self, config: Path) -> None:
        """Add the ``[[job]]`` tables of a ``tasklease.toml``: the jobs a deploy sets up. A
        table with no ``schedule`` overrides a job declared in code: checked now, added by
        :meth:`bind`."""
        tables = read_tables(config)
        waiting = {str(table.get("name")) for table in _overrides(tables)}
        stand_ins = [Job(name, "0 0 * * *") for name in waiting]  # For their code jobs.
        for job in parse_jobs(tables, str(config), declared=stand_ins):
            if job.name not in waiting:
                self._add(job)
        self._tables, self._source = list(tables), str(config)

    def bind(self, router: Router) -> StubScheduler:
        """Add the jobs ``router`` declares in code (``@router.scheduled(...,
        schedule=...)``), with the tables of :meth:`load` over them, as a deploy makes them."""
        from tasklease.worker.handlers.declared_jobs import router_jobs  # noqa: PLC0415

        for job in router_jobs(router, self._tables, self._source):
            self._add(job)
        return self

    def _add(self, job: Job) -> Job:
        """``job``, if its schedule is unix-cron in a known zone (ValueError naming it)."""
        try:
            cron.Cron(job.schedule, job.time_zone)
        except ValueError as exc:
            raise ValueError(f"job {job.name}: {exc}") from exc
        self.jobs[job.name] = job
        return job

    def fire(
        self,
        client: Client,
        job: str,
        at: datetime | None = None,
        *,
        manual: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> Delivered:
        """POST ``/jobs/<job>`` as Cloud Scheduler does.

        Without ``manual``, ``at`` is the slot being delivered (its ``ScheduleTime``; default:
        the job's latest slot so far). With ``manual=True`` it is the moment someone ran
        ``gcloud scheduler jobs run`` (default: now), and the delivery carries the *next*
        slot's time, as the real service sends. The worker tells a manual run by its own
        clock, so ``at`` should be what the app's clock reads (``create_app(clock=...)``).
        Calling ``fire`` again with the same arguments is a retry, or a duplicate, of the
        same run.
        """
        if at is not None and at.tzinfo is None:
            raise ValueError("at must be timezone-aware (e.g. datetime(..., tzinfo=UTC))")
        spec = self.jobs.get(job)
        if manual or at is None:
            if spec is None:
                raise ValueError(
                    f"no schedule for job {job!r}: call add_job({job!r}, '0 3 * * *'), "
                    "bind(router) when its handler declares one, or put its [[job]] table "
                    "in tasklease.toml"
                )
            now, slots = at or datetime.now(UTC), cron.Cron(spec.schedule, spec.time_zone)
            slot = slots.next_slot(now) if manual else slots.last_slot(now)
        else:
            slot = at.astimezone(UTC)
            if spec is not None and not cron.Cron(spec.schedule, spec.time_zone).is_slot(slot):
                raise ValueError(f"{slot} is not a slot of job {job} ({spec.schedule!r})")
        sent = {
            **(headers or {}),
            "User-Agent": "Google-Cloud-Scheduler",
            "X-CloudScheduler": "true",
            c.SCHEDULER_JOB_NAME: job,
            c.SCHEDULER_SCHEDULE_TIME: protocol.rfc3339(slot, "seconds"),
        }
        response = client.post(f"{protocol.SCHEDULER_ROUTE_PREFIX}{job}", headers=sent, data=b"")
        return Delivered(
            "scheduler",
            job,
            response.status_code,
            response.headers.get(protocol.OUTCOME_HEADER),
            schedule_time=slot,
            body=response.get_data(),
        )


def _overrides(tables: Any) -> list[Any]:
    """The ``[[job]]`` tables without a schedule: overrides of a job declared in code."""
    if not isinstance(tables, list):
        return []
    return [t for t in tables if isinstance(t, Mapping) and "schedule" not in t]


def _path(url: str) -> str:
    return "/" + url.split("://", 1)[-1].split("/", 1)[-1]


async def _no_async_sleep(_: float) -> None:
    """The async producer's pause in a stub queue: none."""


def _no_sleep(_: float) -> None:
    """The producer's retry pause: a stub queue never fails a create, so never waited on."""
