"""The settings a queue or a Scheduler job has, read from gcloud's description of it or
wanted by the config: equal (``==``) when no update is needed, and the flags that set them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasklease.deploy.config import Queue
from tasklease.jobs import DEFAULT_ATTEMPT_DEADLINE, Job, Retry


def seconds(value: float) -> str:
    """A duration as gcloud's flags take it: ``600s``, ``0.1s``."""
    return f"{value:g}s"


def duration(value: Any, default: float = 0.0) -> float:
    """A duration as gcloud describes it (``"600s"``), in seconds; ``default`` if absent."""
    return default if value is None else float(str(value).rstrip("s") or 0)


@dataclass(frozen=True)
class QueueSettings:
    """A Cloud Tasks queue's retry and rate settings."""

    max_attempts: int
    max_retry_duration: float
    min_backoff: float
    max_backoff: float
    max_doublings: int
    max_dispatches_per_second: float
    max_concurrent_dispatches: int

    @classmethod
    def described(cls, described: dict[str, Any]) -> QueueSettings:
        """From ``gcloud tasks queues describe``; absent fields are Cloud Tasks' defaults."""
        rate, retry = described.get("rateLimits", {}), described.get("retryConfig", {})
        return cls(
            max_attempts=int(retry.get("maxAttempts", 100)),
            max_retry_duration=duration(retry.get("maxRetryDuration")),
            min_backoff=duration(retry.get("minBackoff")),
            max_backoff=duration(retry.get("maxBackoff")),
            max_doublings=int(retry.get("maxDoublings", 16)),
            max_dispatches_per_second=float(rate.get("maxDispatchesPerSecond", 500)),
            max_concurrent_dispatches=int(rate.get("maxConcurrentDispatches", 1000)),
        )

    @classmethod
    def wanted(cls, queue: Queue) -> QueueSettings:
        return cls(
            max_attempts=queue.max_attempts,
            max_retry_duration=float(queue.max_retry_duration),
            min_backoff=float(queue.min_backoff),
            max_backoff=float(queue.max_backoff),
            max_doublings=queue.max_doublings,
            max_dispatches_per_second=float(queue.max_dispatches_per_second),
            max_concurrent_dispatches=queue.max_concurrent_dispatches,
        )

    def flags(self) -> list[str]:
        """The flags of ``gcloud tasks queues create`` and ``update`` that set these."""
        return [
            f"--max-attempts={self.max_attempts}",
            f"--max-retry-duration={seconds(self.max_retry_duration)}",
            f"--min-backoff={seconds(self.min_backoff)}",
            f"--max-backoff={seconds(self.max_backoff)}",
            f"--max-doublings={self.max_doublings}",
            f"--max-dispatches-per-second={self.max_dispatches_per_second:g}",
            f"--max-concurrent-dispatches={self.max_concurrent_dispatches}",
        ]


@dataclass(frozen=True)
class JobSettings:
    """A Cloud Scheduler HTTP job's schedule, target, OIDC token and retry settings."""

    description: str
    schedule: str | None
    time_zone: str | None
    uri: str | None
    service_account: str | None
    audience: str | None
    attempt_deadline: float
    retry_count: int
    max_retry_duration: float
    min_backoff: float
    max_backoff: float
    max_doublings: int

    @classmethod
    def described(cls, described: dict[str, Any]) -> JobSettings:
        """From ``gcloud scheduler jobs describe``; absent fields are Scheduler's defaults."""
        target, retry = described.get("httpTarget", {}), described.get("retryConfig", {})
        oidc, defaults = target.get("oidcToken", {}), Retry()
        return cls(
            description=str(described.get("description", "")),
            schedule=described.get("schedule"),
            time_zone=described.get("timeZone"),
            uri=target.get("uri"),
            service_account=oidc.get("serviceAccountEmail"),
            audience=oidc.get("audience"),
            attempt_deadline=duration(described.get("attemptDeadline"), DEFAULT_ATTEMPT_DEADLINE),
            retry_count=int(retry.get("retryCount", defaults.retry_count)),
            max_retry_duration=duration(retry.get("maxRetryDuration")),
            min_backoff=duration(retry.get("minBackoffDuration"), defaults.min_backoff),
            max_backoff=duration(retry.get("maxBackoffDuration"), defaults.max_backoff),
            max_doublings=int(retry.get("maxDoublings", defaults.max_doublings)),
        )

    @classmethod
    def wanted(cls, job: Job, url: str, invoker: str) -> JobSettings:
        """``job`` calling the worker at ``url`` with an OIDC token of ``invoker``."""
        return cls(
            description=job.description,
            schedule=job.schedule,
            time_zone=job.time_zone,
            uri=f"{url}/jobs/{job.name}",
            service_account=invoker,
            audience=url,
            attempt_deadline=job.attempt_deadline,
            retry_count=job.retry.retry_count,
            max_retry_duration=job.retry.max_retry_duration,
            min_backoff=job.retry.min_backoff,
            max_backoff=job.retry.max_backoff,
            max_doublings=job.retry.max_doublings,
        )

    def flags(self) -> list[str]:
        """The flags of ``gcloud scheduler jobs create http`` and ``update http``."""
        return [
            f"--schedule={self.schedule}",
            f"--time-zone={self.time_zone}",
            f"--uri={self.uri}",
            "--http-method=POST",
            f"--oidc-service-account-email={self.service_account}",
            f"--oidc-token-audience={self.audience}",
            f"--attempt-deadline={seconds(self.attempt_deadline)}",
            f"--description={self.description}",
            f"--max-retry-attempts={self.retry_count}",
            f"--max-retry-duration={seconds(self.max_retry_duration)}",
            f"--min-backoff={seconds(self.min_backoff)}",
            f"--max-backoff={seconds(self.max_backoff)}",
            f"--max-doublings={self.max_doublings}",
        ]
