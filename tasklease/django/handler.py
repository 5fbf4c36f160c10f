"""The worker side of a Django task: the one tasklease handler that runs them all.

Every Django task is enqueued to ``POST /tasks/django_task`` with its module path, arguments
and result id; the handler imports the :class:`Task` by that path (nothing that is not a
Django Task is ever called) and runs it under tasklease's claim, so a duplicate delivery is
answered from the run's record, not run again. Each attempt sends Django's ``task_started``
and ``task_finished`` signals, as Django's own backends do; a receiver that raises is logged,
never raised into the run: the task's outcome is the task's alone (a ``task_finished``
receiver's error after the task ran would release the run, and the retry would run it again).
"""

from __future__ import annotations

import logging
import traceback
from contextlib import ExitStack
from typing import Any

from django.db import connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from tasklease.django import compat
from tasklease.errors import PermanentFailure
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.observe.logs import instance_id

DJANGO_TASK_HANDLER = "django_task"  # The route: POST /tasks/django_task.

_log = logging.getLogger("tasklease.django")


def payload_for(module_path: str, args: list[Any], kwargs: dict[str, Any], result_id: str) -> Any:
    """What the backend enqueues for one Django task call."""
    return {"task": module_path, "args": args, "kwargs": kwargs, "id": result_id}


def run_django_task(payload: Any, ctx: TaskContext) -> Any:
    """Run the Django task ``payload`` names; its return value is the run's result."""
    task, args, kwargs, result_id = _unpack(payload)
    now = timezone.now()
    result = compat.TaskResult(
        task=task,
        id=result_id,
        status=compat.TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=now,
        last_attempted_at=now,
        finished_at=None,
        args=args,
        kwargs=kwargs,
        backend=task.backend,
        errors=[],
        # One entry per claim: Django's TaskContext.attempt counts them, as tasklease does.
        worker_ids=[instance_id()] * ctx.attempt,
    )
    return _run(task, result, args, kwargs)


def _run(task: Any, result: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Call the task between Django's ``task_started`` and ``task_finished`` signals, the
    result updated as Django's ImmediateBackend does (its fields are frozen: set in place)."""
    sender = type(task.get_backend())
    _send(compat.signals.task_started, sender, result)
    try:
        with _atomic_requests():
            if task.takes_context:
                value = task.call(compat.TaskContext(task_result=result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
    except KeyboardInterrupt:  # As Django's ImmediateBackend: no result for an interrupt.
        raise
    except BaseException as exc:  # Recorded as Django does, then tasklease's to handle.
        _finish(result, compat.TaskResultStatus.FAILED)
        kind = type(exc)
        result.errors.append(
            compat.TaskError(
                exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                traceback="".join(traceback.format_exception(exc)),
            )
        )
        # In the except block: Django's own receiver logs the exception (sys.exc_info()).
        _send(compat.signals.task_finished, sender, result)
        raise
    _finish(result, compat.TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "_return_value", value)
    _send(compat.signals.task_finished, sender, result)
    return value


def _atomic_requests() -> ExitStack:
    """The task in ``transaction.atomic()`` on each database with ``ATOMIC_REQUESTS``, as
    Django would wrap a view (the delivery views are not): its writes commit before the
    run's record, and are rolled back when it raises, so a retry never finds them."""
    stack = ExitStack()
    for alias, settings in connections.settings.items():
        if settings.get("ATOMIC_REQUESTS"):
            stack.enter_context(transaction.atomic(using=alias))
    return stack


def _send(signal: Any, sender: type, result: Any) -> None:
    """Send ``signal`` to every receiver; one that raises is logged, not raised."""
    for receiver, response in signal.send_robust(sender=sender, task_result=result):
        if isinstance(response, Exception):
            _log.error(
                "a receiver of Django's task signal raised; the run goes on (%s)",
                getattr(receiver, "__qualname__", receiver),
                exc_info=response,
            )


def _finish(result: Any, status: Any) -> None:
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "status", status)


def _unpack(payload: Any) -> tuple[Any, list[Any], dict[str, Any], str]:
    """The task, args, kwargs and result id; a payload that can never run is permanent."""
    if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
        raise PermanentFailure("not a Django task payload: no 'task' module path")
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise PermanentFailure("a Django task payload's args is a list, its kwargs an object")
    try:
        task = import_string(payload["task"])
    except ImportError as exc:
        raise PermanentFailure(f"no Django task {payload['task']!r}: {exc}") from exc
    if not isinstance(task, compat.Task):
        raise PermanentFailure(f"{payload['task']!r} is not a Django task (@task)")
    return task, args, kwargs, str(payload.get("id", ""))


def register(router: Router) -> Router:
    """Add the Django task handler to ``router`` (once) and return it."""
    if not router.has_task(DJANGO_TASK_HANDLER):
        router.task(DJANGO_TASK_HANDLER)(run_django_task)
    return router
