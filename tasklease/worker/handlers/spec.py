"""One registered handler and its options: what the router records, the delivery reads, and
the declared jobs are made of. Below the router and its handles, so both (and every module
that reads a handler's options) import it without importing the router.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from tasklease import jobs, protocol
from tasklease.worker.core import constants as c
from tasklease.worker.core.identity import Kind

__all__ = ["ConcurrencyKey", "HandlerSpec", "JobRetry", "OnOverlap"]


@dataclass(frozen=True)
class JobRetry:
    """A scheduled job's retry config (Cloud Scheduler's RetryConfig), with its defaults: no
    retry; backoff from 5 s, doubling 5 times, up to 1 h; no limit on the retries' duration.
    ``retry_count`` is 0 to 5 (Google's limit); the durations are not negative."""

    retry_count: int = 0
    max_retry_duration: timedelta = timedelta(0)
    min_backoff_duration: timedelta = timedelta(seconds=5)
    max_backoff_duration: timedelta = timedelta(hours=1)
    max_doublings: int = 5

    def as_retry(self) -> jobs.Retry:
        """The ``[job.retry]`` table's form (seconds)."""
        return jobs.Retry(
            retry_count=self.retry_count,
            max_retry_duration=self.max_retry_duration.total_seconds(),
            min_backoff=self.min_backoff_duration.total_seconds(),
            max_backoff=self.max_backoff_duration.total_seconds(),
            max_doublings=self.max_doublings,
        )


OnOverlap = Literal["skip", "retry"]
ConcurrencyKey = Callable[[Any], Any]


@dataclass(frozen=True)
class HandlerSpec:
    """One registered handler and its options."""

    kind: Kind
    name: str
    function: Callable[..., Any]
    lease: timedelta = c.DEFAULT_LEASE
    retention: timedelta = c.DEFAULT_RETENTION
    max_attempts: int | None = None
    allowed_service_accounts: tuple[str, ...] | None = None
    audience: str | None = None
    manual_run_margin: timedelta = c.DEFAULT_MANUAL_RUN_MARGIN
    exclusive: bool = False
    max_runtime: timedelta | None = None
    min_gap: timedelta = timedelta(0)
    on_overlap: OnOverlap = "skip"
    concurrency_key: ConcurrencyKey | None = None
    queue: str | None = None  # Where enqueue by reference sends it, unless the call says.
    # The Cloud Scheduler job of a scheduled handler, declared in code (see declared_jobs).
    schedule: str | None = None
    time_zone: str | None = None
    retry: JobRetry | None = None
    description: str = ""
    attempt_deadline: timedelta | None = None
    transactional: bool = False  # Runs inside the store's transaction with its completion.

    @property
    def path(self) -> str:
        """The URL path Cloud Tasks or Cloud Scheduler must POST to."""
        prefix = (
            protocol.TASK_ROUTE_PREFIX
            if self.kind is Kind.TASK
            else protocol.SCHEDULER_ROUTE_PREFIX
        )
        return prefix + self.name
