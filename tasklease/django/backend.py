"""``CloudTasksBackend``: Django's Tasks framework on Cloud Tasks, through tasklease.

``my_task.enqueue(...)`` creates a Cloud Task for ``POST <worker_url>/tasks/django_task``
with tasklease's :class:`~tasklease.producer.Producer`. Inside ``transaction.atomic()`` it
goes through the transactional outbox instead: an entry written through the same database
transaction, created by the relay after the commit, so a rolled-back transaction enqueues
nothing and a crash after the commit loses nothing (``on_commit`` would lose it).

Inside a tasklease handler the new task's key (its ``TaskResult`` id) is derived from the
run and the enqueue's ordinal, so a retried parent names the child it created before;
outside one each call is a new task, as with Django's own backends.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

from django.db import connections
from django.utils import timezone

from tasklease.django import compat
from tasklease.django.handler import DJANGO_TASK_HANDLER, payload_for
from tasklease.producer import Producer
from tasklease.worker.runtime.running import current_call

# OPTIONS keys handed to the Producer; each one missing comes from TASKLEASE_* variables.
PRODUCER_OPTIONS = (
    "project",
    "location",
    "queue",
    "worker_url",
    "service_account",
    "audience",
    "tasks_endpoint",
    "dispatch_deadline",
    "transport",
    "batch",
    "retry",
    "timeout",
)
OTHER_OPTIONS = ("database",)


class CloudTasksBackend(compat.BaseTaskBackend):  # type: ignore[misc]
    """A Django Tasks backend creating Cloud Tasks run once by tasklease's worker.

    Supported: ``run_after`` (the task's schedule time, at most 30 days ahead; a naive one,
    which Django allows when ``USE_TZ`` is False, in the project's ``TIME_ZONE``),
    ``queue_name`` (the Cloud Tasks queue; ``"default"`` is the producer's ``queue``; list
    others in ``QUEUES``), ``takes_context`` (``context.attempt`` is tasklease's count of
    claims), ``async def`` tasks. Refused, with Django's ``InvalidTask``: a ``priority``
    other than the default (Cloud Tasks has no priorities: use a queue of its own). Not
    supported: ``get_result`` (results live in the worker's store: ``tasklease runs``).

    ``OPTIONS``: the producer's settings (``project``, ``location``, ``queue``,
    ``worker_url``, ``service_account``, ``audience``, ``tasks_endpoint``,
    ``dispatch_deadline``, ``transport``, ...; each unset one from its ``TASKLEASE_*``
    variable) and ``database``, the alias whose ``atomic()`` blocks stage into the outbox
    (default ``"default"``).
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = False
    supports_priority = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options: dict[str, Any] = dict(self.options)
        unknown = sorted(set(options) - set(PRODUCER_OPTIONS) - set(OTHER_OPTIONS))
        if unknown:
            raise compat.InvalidTask(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown keys {unknown}: use "
                f"{', '.join(PRODUCER_OPTIONS + OTHER_OPTIONS)}"
            )
        self.database: str = options.pop("database", "default")
        self._producer_options = options
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    @property
    def producer(self) -> Producer:
        """The producer, built on first use (``Producer.from_env`` with the OPTIONS)."""
        with self._lock:
            if self._producer is None:
                self._producer = Producer.from_env(**self._producer_options)
            return self._producer

    @producer.setter
    def producer(self, producer: Producer) -> None:
        """Replace the producer: tests give it a stub queue's (``StubQueue().producer``)."""
        with self._lock:
            self._producer = producer

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        args, kwargs = _json_arguments(list(args), dict(kwargs))
        result_id = _result_id(task)
        queue = None if task.queue_name == compat.DEFAULT_TASK_QUEUE_NAME else task.queue_name
        # The result id is the key: the Cloud Task's name, and so the worker's run, derive
        # from it, and every re-send of an outbox entry asks for that same name.
        self.producer.enqueue(
            DJANGO_TASK_HANDLER,
            payload_for(task.module_path, args, kwargs, result_id),
            key=result_id,
            transaction=self._transaction(),
            at=_aware(task.run_after),
            queue=queue,
        )
        result = compat.TaskResult(
            task=task,
            id=result_id,
            status=compat.TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        compat.signals.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """Refused: a task's result is its run's record in the worker's store."""
        raise NotImplementedError(
            f"CloudTasksBackend keeps no TaskResult for {result_id!r}: the result is the run "
            "record in the worker's store (tasklease runs, the dashboard)"
        )

    def _transaction(self) -> Any:
        """The raw DB-API connection when inside ``atomic()`` on ``database``, else None."""
        connection = connections[self.database]
        if not connection.in_atomic_block:
            return None
        return connection.connection


def _result_id(task: Any) -> str:
    """The new task's result id, its key: inside a tasklease handler, derived from the run
    and this enqueue's place among the handler's enqueues of ``task`` on its queue, so every
    attempt of the run names the same task (a retry creates no second one); elsewhere a new
    one per call, as Django's own backends give."""
    call = current_call()
    if call is None:
        return uuid.uuid4().hex
    return call.next_enqueue_key(task.module_path, task.queue_name)


def _aware(run_after: Any) -> Any:
    """``run_after`` as a moment: Django takes a naive one when ``USE_TZ`` is False, a time
    in the project's ``TIME_ZONE`` (as ``timezone.now()`` gives it then)."""
    if run_after is not None and timezone.is_naive(run_after):
        return timezone.make_aware(run_after)
    return run_after


def _json_arguments(args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The arguments as the task will receive them (JSON), or InvalidTask before sending."""
    try:
        text = json.dumps([args, kwargs], allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise compat.InvalidTask(f"a Django task's arguments must be JSON: {exc}") from exc
    loaded_args, loaded_kwargs = json.loads(text)
    return loaded_args, loaded_kwargs
