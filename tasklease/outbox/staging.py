"""The producer's ``transaction=`` path: stage built tasks as outbox entries, send nothing."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tasklease.outbox import adapters
from tasklease.outbox.entries import Entry
from tasklease.producer.results import EnqueueResult
from tasklease.producer.transport import TaskRequest


def stage(
    tx: Any, task_name: str, requests: Sequence[tuple[str | None, TaskRequest]]
) -> list[EnqueueResult]:
    """One entry per request through ``tx``; results say ``staged`` (False: already staged)."""
    now = time.time()
    entries = [Entry(task_name, request, now) for _, request in requests]
    staged = adapters.stage(tx, entries)
    return [
        EnqueueResult(request.name, request.task_id, key, False, 0, staged=new)
        for (key, request), new in zip(requests, staged, strict=True)
    ]
