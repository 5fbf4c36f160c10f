from __future__ import annotations

from datetime import UTC, datetime

from flask.testing import FlaskClient
from myapp import mail, tasks

from tasklease import create_app
from tasklease.testing.stubs import StubQueue, StubScheduler

MONDAY_8AM = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)  # A slot of "0 8 * * 1" (tasklease.toml).


def test_a_signup_sends_one_welcome_whatever_the_queue_repeats(
    client: FlaskClient, tasklease_queue: StubQueue
) -> None:
    tasks.sign_up("ann@example.com")
    tasks.sign_up("ann@example.com")  # A retried web request: the task name absorbs it.
    summary = tasklease_queue.drain(client, duplicate_every=1, lose_response_every=2)
    assert mail.outbox == [("ann@example.com", "Welcome!")]
    assert summary.executions("send_welcome") == 1
    assert summary.outcomes["duplicate"] >= 1


def test_a_bad_address_fails_once_and_is_not_retried(
    client: FlaskClient, tasklease_queue: StubQueue
) -> None:
    tasks.sign_up("not-an-address")
    assert tasklease_queue.drain(client).outcomes == {"failed": 1}
    assert mail.outbox == []


def test_the_weekly_digest_reaches_each_subscriber_once(
    client: FlaskClient, tasklease_queue: StubQueue, tasklease_scheduler: StubScheduler
) -> None:
    assert tasklease_scheduler.fire(client, "weekly_digest", at=MONDAY_8AM).outcome == "processed"
    # Cloud Scheduler delivers at least once: the same run again creates nothing.
    assert tasklease_scheduler.fire(client, "weekly_digest", at=MONDAY_8AM).outcome == "duplicate"
    tasklease_queue.drain(client, duplicate_every=2)
    assert sorted(mail.outbox) == [
        ("ann@example.com", "Your weekly digest"),
        ("bob@example.com", "Your weekly digest"),
    ]


def test_a_manual_run_is_a_run_of_its_own(
    client: FlaskClient, tasklease_queue: StubQueue, tasklease_scheduler: StubScheduler
) -> None:
    thursday = datetime(2026, 3, 5, 15, 0, tzinfo=UTC)
    worker = create_app(tasks.router, store="memory://", auth="none", clock=lambda: thursday)
    # `gcloud scheduler jobs run` on Thursday sends next Monday's slot, days early.
    manual = tasklease_scheduler.fire(
        worker.test_client(), "weekly_digest", at=thursday, manual=True
    )
    assert manual.schedule_time == datetime(2026, 3, 9, 8, 0, tzinfo=UTC)
    assert manual.outcome == "processed"
    tasklease_queue.drain(client)
    assert len(mail.outbox) == 2
