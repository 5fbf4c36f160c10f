"""A simulated Cloud Tasks queue and Cloud Scheduler, as their documentation describes them:
at-least-once delivery, a rare duplicate, answers lost on the way back, retries with the
queue's backoff (:mod:`tasklease.emulator.policy`, the emulator's formulas), dispatch deadlines,
named tasks refused while their name is remembered, and a scheduler that retries a slot up to
its retry count and runs a job by hand on request.

Each dispatch becomes a :class:`~tasklease.worker.delivery.executor.Delivery` to the real
executor of a worker instance (:class:`Fleet`), run as an actor of the engine.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from tasklease import protocol
from tasklease.emulator.policy import RetrySettings, backoff, gives_up
from tasklease.producer.errors import PermanentEnqueueError, TaskAlreadyExists
from tasklease.producer.transport import BatchOutcome, TaskRequest, TaskTransport
from tasklease.testing.simulation.engine import EPOCH, Engine, Instance
from tasklease.testing.simulation.faults import FaultPlan, Trace
from tasklease.testing.simulation.history import Answer, History, Origin
from tasklease.worker.core import constants as c
from tasklease.worker.core.identity import Kind
from tasklease.worker.delivery.executor import Delivery, Executor

__all__ = ["DeliverySender", "Fleet", "ScheduledJob", "SimulatedQueue", "SimulatedScheduler"]

# Cloud Tasks' default dispatch deadline for an HTTP task is 10 minutes
# (https://cloud.google.com/tasks/docs/reference/rest/v2/projects.locations.queues.tasks#Task).
DISPATCH_DEADLINE = 600.0
QUEUE_PATH = "projects/sim-project/locations/us-central1/queues/sim"
WORKER_URL = "http://worker.sim"


class Fleet:
    """The worker instances deliveries go to; a killed one is replaced by a new instance."""

    def __init__(
        self,
        size: int,
        rng: random.Random,
        make_executor: Callable[[Instance], Executor],
        skew: Callable[[], timedelta],
    ) -> None:
        self.rng = rng
        self.make_executor = make_executor
        self.skew = skew
        self.started = 0
        self.instances: list[tuple[Instance, Executor]] = []
        for _ in range(size):
            self.instances.append(self._start())

    def _start(self) -> tuple[Instance, Executor]:
        self.started += 1
        instance = Instance(f"i{self.started}", self.skew())
        return instance, self.make_executor(instance)

    def pick(self) -> tuple[Instance, Executor]:
        """A live instance, chosen by the seed."""
        index = self.rng.randrange(len(self.instances))
        if self.instances[index][0].killed:
            self.instances[index] = self._start()
        return self.instances[index]


@dataclass
class _Attempt:
    number: int
    resolved: bool = False


@dataclass
class _Task:
    request: TaskRequest
    origin: Origin
    attempts: int = 0  # Dispatches so far (X-CloudTasks-TaskRetryCount of the next).
    executions: int = 0  # Answers other than 5xx (X-CloudTasks-TaskExecutionCount).
    first_at: float | None = None
    previous_response: int | None = None
    retry_reason: str | None = None
    current: _Attempt | None = None
    done: bool = False


class DeliverySender:
    """Sends one delivery to an instance as an actor and hands its answer back."""

    def __init__(
        self, engine: Engine, fleet: Fleet, plan: FaultPlan, rng: random.Random, trace: Trace
    ) -> None:
        self.engine, self.fleet, self.plan, self.rng, self.trace = engine, fleet, plan, rng, trace
        self.deliveries = 0
        self.closed = False  # Once the simulation ends: nothing more is delivered.

    def deadline(self, configured: float, label: str) -> float:
        """How long the sender waits for this attempt's answer: ``configured``, or (the
        ``dispatch_deadline`` fault) a deadline shorter than the handler may take."""
        if (
            self.plan.on("dispatch_deadline")
            and self.rng.random() < self.plan.dispatch_deadline
            and self.trace.fires("dispatch_deadline")
        ):
            self.trace.fault("dispatch_deadline", label)
            return self.rng.uniform(0.5, 8.0)
        return configured

    def send(
        self,
        delivery: Delivery,
        origin: Origin,
        answered: Callable[[int], None],
        *,
        label: str,
    ) -> None:
        """Deliver, and call ``answered(status)`` when the answer reaches the sender."""
        if self.closed:
            return
        copies = 1
        if (
            self.plan.on("duplicate")
            and self.rng.random() < self.plan.duplicate
            and self.trace.fires("duplicate")
        ):
            self.trace.fault("duplicate", label)
            copies = 2
        for copy in range(copies):
            self._send_one(delivery, origin, answered, label=f"{label}{'+dup' if copy else ''}")

    def _send_one(
        self, delivery: Delivery, origin: Origin, answered: Callable[[int], None], *, label: str
    ) -> None:
        instance, executor = self.fleet.pick()
        self.deliveries += 1
        origin.deliveries += 1
        engine, rng, plan, trace = self.engine, self.rng, self.plan, self.trace

        def deliver() -> None:
            trace.note(f"deliver {label} to {instance.name}")
            reply = executor.execute(delivery)
            trace.note(f"reply {label} {reply.status} {reply.outcome.value}")
            engine.pause(rng.uniform(0.001, 0.05))  # The answer on its way.
            if (
                plan.on("lost_response")
                and rng.random() < plan.lost_response
                and trace.fires("lost_response")
            ):
                trace.fault("lost_response", label)
                return
            answered(reply.status)

        engine.spawn(
            f"{instance.name}:{label}",
            instance,
            deliver,
            delay=rng.uniform(0.0, 0.05),
            origin=origin.name,
        )


class SimulatedQueue(TaskTransport):
    """A Cloud Tasks queue: the producer's transport, and the dispatcher of its tasks."""

    # "A maximum of 100 tasks can be created in a single batch" (BatchCreateTasksRequest).
    max_batch_size = 100

    def __init__(
        self,
        engine: Engine,
        dispatcher: DeliverySender,
        history: History,
        trace: Trace,
        rng: random.Random,
        *,
        retry: RetrySettings,
        dispatch_deadline: float = DISPATCH_DEADLINE,
        classify: Callable[[TaskRequest], Origin],
    ) -> None:
        self.engine, self.dispatcher, self.history, self.trace, self.rng = (
            engine,
            dispatcher,
            history,
            trace,
            rng,
        )
        self.retry = retry
        self.dispatch_deadline = dispatch_deadline
        self.classify = classify
        self.tasks: dict[str, _Task] = {}
        self.batches: dict[str, BatchOutcome] = {}  # Each batch's answer, by request_id.

    # --- the producer's side ----------------------------------------------------------

    def create_task(self, task: TaskRequest, timeout: float) -> None:
        self.engine.pause(self.rng.uniform(0.001, 0.02))
        if not self._accept(task):
            raise TaskAlreadyExists(f"task {task.name} already exists")

    def create_tasks(
        self, tasks: Sequence[TaskRequest], request_id: str, timeout: float
    ) -> BatchOutcome:
        """BatchCreateTasks: up to :attr:`max_batch_size` tasks of one queue, each accepted
        (or its name found taken) as its own create is; a repeated ``request_id`` gets the
        first call's answer back (docs/platform-facts.md, "Cloud Tasks: BatchCreateTasks")."""
        if len(tasks) > self.max_batch_size or len({t.queue_path for t in tasks}) > 1:
            raise PermanentEnqueueError(
                f"a batch holds at most {self.max_batch_size} tasks, all of one queue"
            )
        replayed = self.batches.get(request_id)
        if replayed is not None:
            return replayed
        created: set[str] = set()
        existed: set[str] = set()
        for task in tasks:
            # The draw a single create makes: a batch's run is, draw for draw, its creates'.
            self.engine.pause(self.rng.uniform(0.001, 0.02))
            (created if self._accept(task) else existed).add(task.name)
        outcome = BatchOutcome(frozenset(created), frozenset(existed))
        self.batches[request_id] = outcome
        return outcome

    def _accept(self, task: TaskRequest) -> bool:
        """Queue ``task`` for dispatch; False if its name is taken (Cloud Tasks keeps a
        name for a while after its task ran; here, for the whole simulation)."""
        if task.name in self.tasks:
            self.trace.note(f"create {task.task_id}: exists")
            return False
        origin = self.classify(task)
        origin.created_at = self.engine.now
        self.history.origins[origin.name] = origin
        queued = _Task(task, origin)
        self.tasks[task.name] = queued
        self.trace.note(f"create {task.task_id}")
        eta = 0.0
        if task.schedule_time is not None:
            eta = max((task.schedule_time - EPOCH).total_seconds() - self.engine.now, 0.0)
        self.engine.at(eta + self.rng.uniform(0.0, 0.5), lambda: self._dispatch(queued))
        return True

    # --- the queue's side -------------------------------------------------------------

    def _dispatch(self, task: _Task) -> None:
        if task.done or task.origin.given_up:
            return
        if task.first_at is None:
            task.first_at = self.engine.now
        attempt = _Attempt(task.attempts)
        task.current = attempt
        request = task.request
        headers = {
            **request.headers,
            "User-Agent": "Google-Cloud-Tasks",
            c.TASKS_QUEUE_NAME: request.queue_path.rsplit("/", 1)[-1],
            c.TASKS_TASK_NAME: request.task_id,
            c.TASKS_RETRY_COUNT: str(task.attempts),
            c.TASKS_EXECUTION_COUNT: str(task.executions),
            c.TASKS_ETA: f"{(EPOCH + timedelta(seconds=self.engine.now)).timestamp():.6f}",
        }
        if task.previous_response is not None:
            headers[c.TASKS_PREVIOUS_RESPONSE] = str(task.previous_response)
        if task.retry_reason:
            headers[c.TASKS_RETRY_REASON] = task.retry_reason
        task.attempts += 1
        handler = request.url.rsplit("/", 1)[-1]
        delivery = Delivery(
            kind=Kind.TASK,
            handler=handler,
            header=_lookup(headers),
            query={},
            body=request.body,
            url="/" + request.url.split("://", 1)[-1].split("/", 1)[-1],
        )
        label = f"{request.task_id[-10:]}#{attempt.number}"
        self.dispatcher.send(
            delivery, task.origin, lambda status: self._answered(task, attempt, status), label=label
        )
        deadline = self.dispatcher.deadline(
            request.dispatch_deadline.total_seconds()
            if request.dispatch_deadline
            else self.dispatch_deadline,
            label,
        )
        self.engine.at(deadline, lambda: self._deadline(task, attempt))

    def _answered(self, task: _Task, attempt: _Attempt, status: int) -> None:
        self.history.answers.append(Answer(self.engine.now, task.origin.name, status))
        if attempt.resolved:
            return  # The queue gave up on this attempt at its deadline.
        self._resolve(task, attempt, status)

    def _deadline(self, task: _Task, attempt: _Attempt) -> None:
        if attempt.resolved:
            return
        self.trace.note(f"deadline {task.request.task_id[-10:]}#{attempt.number}")
        self._resolve(task, attempt, None)

    def _resolve(self, task: _Task, attempt: _Attempt, status: int | None) -> None:
        attempt.resolved = True
        if status is not None and status < 500:
            task.executions += 1
        task.previous_response = status
        if status is not None and 200 <= status < 300:
            task.done = True
            if task.origin.acknowledged_at is None:
                task.origin.acknowledged_at = self.engine.now
            self.trace.note(f"done {task.request.task_id[-10:]}")
            return
        task.retry_reason = f"HTTP {status}" if status else "DEADLINE_EXCEEDED"
        assert task.first_at is not None
        if gives_up(self.retry, task.attempts, self.engine.now - task.first_at):
            task.origin.given_up = True
            self.trace.note(f"gave up {task.request.task_id[-10:]}")
            return
        delay = backoff(self.retry, task.attempts)
        self.engine.at(delay, lambda: self._dispatch(task))

    @property
    def settled(self) -> bool:
        """Every task answered with a 2xx or given up."""
        return all(t.done or t.origin.given_up for t in self.tasks.values())


@dataclass
class ScheduledJob:
    """A Cloud Scheduler job of the simulation: its handler's name and retry config. Its
    handler declares no schedule, so any second can be one of its slots."""

    name: str
    retry_count: int
    min_backoff: float = 5.0
    max_backoff: float = 3600.0
    max_doublings: int = 5
    attempt_deadline: float = 180.0  # Cloud Scheduler's default for HTTP targets.
    resources: tuple[str, ...] = ()
    transactional: bool = False


@dataclass
class _Run:
    origin: Origin
    job: ScheduledJob
    slot: float  # The ScheduleTime it carries (a manual run: the next slot's).
    attempts: int = 0
    current: _Attempt | None = None
    done: bool = False
    extra_headers: dict[str, str] = field(default_factory=dict)


class SimulatedScheduler:
    """Cloud Scheduler: each job's slots, retried up to the job's retry count, and manual
    runs, which carry the *next* slot's ScheduleTime, as the real service sends."""

    def __init__(
        self,
        engine: Engine,
        dispatcher: DeliverySender,
        history: History,
        trace: Trace,
        rng: random.Random,
    ) -> None:
        self.engine, self.dispatcher, self.history, self.trace, self.rng = (
            engine,
            dispatcher,
            history,
            trace,
            rng,
        )
        self.runs: list[_Run] = []
        self.manual_count = 0

    def fire_slot(self, job: ScheduledJob, slot: float) -> None:
        """Deliver ``job``'s slot at virtual time ``slot`` (call at that time)."""
        stamp = protocol.rfc3339(EPOCH + timedelta(seconds=slot), "seconds")
        origin = Origin(
            f"slot:{job.name}@{stamp}",
            "slot",
            job.name,
            job.transactional,
            self.engine.now,
            resources=job.resources,
        )
        self._start(_Run(origin, job, slot))

    def run_now(self, job: ScheduledJob, next_slot: float) -> None:
        """``gcloud scheduler jobs run``: a manual run, now, carrying ``next_slot``."""
        self.manual_count += 1
        origin = Origin(
            f"manual:{job.name}#{self.manual_count}",
            "manual",
            job.name,
            job.transactional,
            self.engine.now,
            resources=job.resources,
        )
        self._start(_Run(origin, job, next_slot))

    def _start(self, run: _Run) -> None:
        self.history.origins[run.origin.name] = run.origin
        self.runs.append(run)
        self.trace.note(f"fire {run.origin.name}")
        self._dispatch(run)

    def _dispatch(self, run: _Run) -> None:
        attempt = _Attempt(run.attempts)
        run.current = attempt
        run.attempts += 1
        headers = {
            "User-Agent": "Google-Cloud-Scheduler",
            "X-CloudScheduler": "true",
            c.SCHEDULER_JOB_NAME: run.job.name,
            c.SCHEDULER_SCHEDULE_TIME: protocol.rfc3339(
                EPOCH + timedelta(seconds=run.slot), "seconds"
            ),
        }
        delivery = Delivery(
            kind=Kind.SCHEDULER,
            handler=run.job.name,
            header=_lookup(headers),
            query={},
            body=b"",
            url=f"{protocol.SCHEDULER_ROUTE_PREFIX}{run.job.name}",
        )
        label = f"{run.origin.name}#{attempt.number}"
        self.dispatcher.send(
            delivery, run.origin, lambda status: self._answered(run, attempt, status), label=label
        )
        deadline = self.dispatcher.deadline(run.job.attempt_deadline, label)
        self.engine.at(deadline, lambda: self._resolve(run, attempt, None))

    def _answered(self, run: _Run, attempt: _Attempt, status: int) -> None:
        self.history.answers.append(Answer(self.engine.now, run.origin.name, status))
        self._resolve(run, attempt, status)

    def _resolve(self, run: _Run, attempt: _Attempt, status: int | None) -> None:
        if attempt.resolved:
            return
        attempt.resolved = True
        if status is None:
            self.trace.note(f"deadline {run.origin.name}#{attempt.number}")
        if status is not None and 200 <= status < 300:
            run.done = True
            if run.origin.acknowledged_at is None:
                run.origin.acknowledged_at = self.engine.now
            return
        retries = run.attempts - 1
        if retries >= run.job.retry_count:
            run.origin.given_up = True
            self.trace.note(f"gave up {run.origin.name}")
            return
        job = run.job
        delay = min(job.min_backoff * 2 ** min(retries, job.max_doublings), job.max_backoff)
        self.engine.at(delay, lambda: self._dispatch(run))

    @property
    def settled(self) -> bool:
        return all(r.done or r.origin.given_up for r in self.runs)


def _lookup(headers: Mapping[str, str]) -> Callable[[str], list[str]]:
    lowered = {name.lower(): value for name, value in headers.items()}
    return lambda name: [lowered[name.lower()]] if name.lower() in lowered else []
