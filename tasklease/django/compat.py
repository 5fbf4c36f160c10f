"""Django's Tasks framework, wherever it is installed: ``django.tasks`` (Django 6), else the
``django-tasks`` backport (Django 5.2 on Python 3.11, which Django 6 does not support)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

INSTALL_HINT = (
    "tasklease.django needs Django's Tasks framework: pip install 'tasklease[django]' "
    "(Django 6; on Python 3.11, Django 5.2 with the django-tasks backport)"
)


def _load(*names: str) -> ModuleType:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(INSTALL_HINT)


tasks: Any = _load("django.tasks", "django_tasks")
_base: Any = _load(f"{tasks.__name__}.backends.base")
_exceptions: Any = _load(f"{tasks.__name__}.exceptions")

BaseTaskBackend: Any = _base.BaseTaskBackend
Task: Any = importlib.import_module(f"{tasks.__name__}.base").Task
TaskResult: Any = tasks.TaskResult
TaskResultStatus: Any = tasks.TaskResultStatus
TaskContext: Any = tasks.TaskContext
TaskError: Any = importlib.import_module(f"{tasks.__name__}.base").TaskError
DEFAULT_TASK_QUEUE_NAME: str = tasks.DEFAULT_TASK_QUEUE_NAME
# Django 6 names it InvalidTask; the backport, InvalidTaskError.
InvalidTask: type[Exception] = getattr(
    _exceptions, "InvalidTask", getattr(_exceptions, "InvalidTaskError", ValueError)
)
signals: Any = _load(f"{tasks.__name__}.signals")
