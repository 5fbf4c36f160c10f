from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from tasklease.errors import InvalidDelivery
from tasklease.worker.core.identity import (
    DeliveryIdentity,
    HeaderLookup,
    Kind,
    parse_identity,
    parse_rfc3339,
)
from tests.support.helpers import job_headers, task_headers

MARGIN = timedelta(seconds=60)


def lookup(headers: Mapping[str, str | list[str]]) -> HeaderLookup:
    lowered = {name.lower(): value for name, value in headers.items()}

    def get(name: str) -> Sequence[str]:
        value = lowered.get(name.lower())
        if value is None:
            return []
        return value if isinstance(value, list) else [value]

    return get


def parse_task(
    headers: Mapping[str, str | list[str]], query: Mapping[str, str] | None = None
) -> DeliveryIdentity:
    return parse_identity(Kind.TASK, "h", lookup(headers), query or {})


def parse_job(
    headers: Mapping[str, str | list[str]], query: Mapping[str, str] | None = None
) -> DeliveryIdentity:
    return parse_identity(Kind.SCHEDULER, "h", lookup(headers), query or {})


def test_task_identity_reads_every_cloud_tasks_header() -> None:
    identity = parse_task(
        task_headers(retry=3, execution=2, eta=1_792_152_000.25)
        | {"X-CloudTasks-TaskPreviousResponse": "500", "X-CloudTasks-TaskRetryReason": "timeout"}
    )
    assert (identity.queue, identity.task_name) == ("default", "task-1")
    assert (identity.retry_count, identity.execution_count) == (3, 2)
    assert identity.eta == datetime(2026, 10, 16, 12, 0, 0, 250000, tzinfo=UTC)
    assert (identity.previous_response, identity.retry_reason) == (500, "timeout")


def test_run_id_ignores_per_attempt_headers() -> None:
    first = parse_task(task_headers(retry=0, execution=0))
    retry = parse_task(task_headers(retry=5, execution=4, eta=1_792_152_100))
    assert first.run_id == retry.run_id
    assert len(first.run_id) == 64


def test_run_id_separates_queues_tasks_projects_and_locations() -> None:
    ids = {
        parse_task(task_headers()).run_id,
        parse_task(task_headers(queue="other")).run_id,
        parse_task(task_headers(task="task-2")).run_id,
        parse_task(task_headers(), {"project": "p1"}).run_id,
        parse_task(task_headers() | {"X-Tasklease-Project": "p2"}).run_id,
        parse_task(task_headers(), {"project": "p1", "location": "us-central1"}).run_id,
    }
    assert len(ids) == 6


def test_schedule_times_with_different_offsets_are_one_run() -> None:
    utc = parse_job(job_headers(schedule_time="2026-10-16T12:00:00Z"))
    pacific = parse_job(job_headers(schedule_time="2026-10-16T05:00:00-07:00"))
    assert utc.schedule_time == pacific.schedule_time
    assert utc.run_id == pacific.run_id
    later = parse_job(job_headers(schedule_time="2026-10-16T12:00:01Z"))
    assert later.run_id != utc.run_id


def test_headers_are_read_case_insensitively() -> None:
    lowered = {name.lower(): value for name, value in task_headers().items()}
    assert parse_task(lowered).run_id == parse_task(task_headers()).run_id


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"X-CloudTasks-TaskName": "t"}, "QueueName header is missing"),
        ({"X-CloudTasks-QueueName": "q"}, "TaskName header is missing"),
        (task_headers(task="bad/name"), "TaskName header is not valid"),
        (task_headers(task="a" * 501), "TaskName header is not valid"),
        (task_headers(task="a" * 10_240), "10240 characters long"),
        (task_headers(task="ｔａｓｋ"), "TaskName header is not valid"),
        (task_headers(retry=-1), "RetryCount header is not valid"),
        (task_headers() | {"X-CloudTasks-TaskRetryCount": "two"}, "RetryCount"),
        (task_headers() | {"X-CloudTasks-TaskRetryCount": "٣"}, "RetryCount"),
        (task_headers() | {"X-CloudTasks-TaskETA": "nan"}, "TaskETA"),
        (task_headers() | {"X-CloudTasks-TaskETA": "1e300"}, "TaskETA"),
        (task_headers() | {"X-CloudTasks-TaskPreviousResponse": "999"}, "PreviousResponse"),
        (task_headers() | {"X-CloudTasks-TaskName": ["a", "b"]}, "2 times with different"),
        (task_headers(), "query parameter project"),
    ],
)
def test_invalid_task_headers_are_refused_with_the_reason(
    headers: dict[str, str], message: str
) -> None:
    query = {"project": "Bad Project!"} if message.startswith("query") else {}
    with pytest.raises(InvalidDelivery, match=message):
        parse_task(headers, query)


def test_a_repeated_header_with_one_value_is_accepted() -> None:
    headers = task_headers() | {"X-CloudTasks-TaskName": ["same", "same"]}
    assert parse_task(headers).task_name == "same"


@pytest.mark.parametrize(
    "value",
    [
        "",
        "yesterday",
        "2026-10-16",
        "2026-10-16T12:00:00",
        "1900-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "2026-13-01T00:00:00Z",
        "２０２６-10-16T12:00:00Z",
    ],
)
def test_malformed_or_absurd_schedule_times_are_refused(value: str) -> None:
    with pytest.raises(InvalidDelivery, match="ScheduleTime"):
        parse_job(job_headers(schedule_time=value))


def test_rfc3339_accepts_nanoseconds_and_lowercase_z() -> None:
    parsed = parse_rfc3339("2026-10-16t12:00:00.123456789z")
    assert parsed == datetime(2026, 10, 16, 12, 0, 0, 123456, tzinfo=UTC)


def test_identity_fields_keep_only_what_was_sent() -> None:
    assert parse_job(job_headers()).fields() == {
        "job_name": "nightly",
        "schedule_time": "2026-10-16T12:00:00.000000Z",
        "trigger": "scheduled",
    }


def test_only_a_delivery_earlier_than_the_margin_is_surely_manual() -> None:
    slot = datetime(2026, 10, 16, 12, 0, tzinfo=UTC)
    headers = lookup(job_headers(schedule_time="2026-10-16T12:00:00Z"))

    def at(seconds: float) -> DeliveryIdentity:
        received = slot - timedelta(seconds=seconds)
        return parse_identity(
            Kind.SCHEDULER, "h", headers, {}, received_at=received, manual_run_margin=MARGIN
        )

    assert (at(61).manual, at(61).maybe_manual) == (True, False)
    for seconds in (60, 30, 0.5, 0, -3600):  # Within the margin, before or after the slot.
        assert (at(seconds).manual, at(seconds).maybe_manual) == (False, True), seconds
    assert at(30).as_manual().run_id != at(30).run_id
    assert at(30).as_manual().as_slot() == at(30).as_slot()
