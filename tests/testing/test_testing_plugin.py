"""The pytest plugin (tasklease.testing): its fixtures, used here as a user's tests use them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import flask
import pytest

from tasklease.testing.stubs import StubQueue, StubScheduler
from tasklease.worker import PermanentFailure, Router, TaskContext, create_app
from tasklease.worker.stores import MemoryStore
from tests.support.fresh_python import modules_loaded_by

pytest_plugins = ["pytester"]

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Shop:
    """A user's handlers: effects recorded per key, with the contexts they ran in."""

    def __init__(self, queue: StubQueue) -> None:
        self.queue = queue
        self.now = NOW
        self.effects: list[str] = []
        self.contexts: list[TaskContext] = []
        self.failures_left = 0
        self.router = Router()
        self.router.task("greet")(self.greet)
        self.router.task("flaky")(self.flaky)
        self.router.task("poison")(self.poison)
        self.router.scheduled("nightly")(self.nightly)

    def greet(self, payload: dict[str, Any], ctx: TaskContext) -> dict[str, str]:
        self.contexts.append(ctx)
        self.effects.append(f"greet:{payload['who']}")
        return {"greeted": payload["who"]}

    def flaky(self, payload: dict[str, Any], ctx: TaskContext) -> None:
        self.contexts.append(ctx)
        if self.failures_left:
            self.failures_left -= 1
            raise RuntimeError("downstream unavailable")
        self.effects.append("flaky")

    def poison(self, payload: dict[str, Any], ctx: TaskContext) -> None:
        raise PermanentFailure("bad payload")

    def nightly(self, ctx: TaskContext) -> None:
        self.contexts.append(ctx)
        assert ctx.schedule_time is not None
        self.effects.append(f"nightly:{ctx.schedule_time:%Y-%m-%dT%H:%M}")
        self.queue.producer.fan_out(ctx, "greet", [(w, {"who": w}) for w in ("ann", "bob")])

    def client(self) -> flask.testing.FlaskClient:
        app = create_app(self.router, store=MemoryStore(), auth="none", clock=lambda: self.now)
        return app.test_client()


@pytest.fixture
def shop(tasklease_queue: StubQueue) -> Shop:
    return Shop(tasklease_queue)


@pytest.fixture
def client(shop: Shop) -> Iterator[flask.testing.FlaskClient]:
    yield shop.client()


def test_drain_delivers_each_task_once_with_the_headers_cloud_tasks_sends(
    shop: Shop, client: flask.testing.FlaskClient, tasklease_queue: StubQueue
) -> None:
    created = tasklease_queue.producer.enqueue("greet", {"who": "ann"}, key="ann")
    summary = tasklease_queue.drain(client)
    assert summary.outcomes == {"processed": 1}
    assert shop.effects == ["greet:ann"]
    [ctx] = shop.contexts
    assert (ctx.queue, ctx.task_name) == ("default", created.task_id)
    assert (ctx.retry_count, ctx.execution_count, ctx.previous_response) == (0, 0, None)
    assert ctx.project == "test-project" and ctx.location == "us-central1"
    assert ctx.eta is not None and abs(ctx.eta - datetime.now(UTC)) < timedelta(minutes=1)
    assert summary.deliveries[0].json()["result"] == {"greeted": "ann"}
    [task] = tasklease_queue.tasks
    assert (task.handler, task.payload, task.done, task.attempts) == (
        "greet",
        {"who": "ann"},
        True,
        1,
    )
    assert tasklease_queue.pending() == []
    assert tasklease_queue.drain(client).deliveries == []


def test_a_key_enqueued_twice_makes_one_task_as_cloud_tasks_names_do(
    tasklease_queue: StubQueue,
) -> None:
    first = tasklease_queue.producer.enqueue("greet", {"who": "ann"}, key="ann")
    again = tasklease_queue.producer.enqueue("greet", {"who": "ann"}, key="ann")
    assert (first.created, again.created) == (True, False)
    assert len(tasklease_queue.tasks) == 1


def test_injected_duplicates_and_lost_responses_run_each_handler_once(
    shop: Shop, client: flask.testing.FlaskClient, tasklease_queue: StubQueue
) -> None:
    for who in ("ann", "bob", "cy", "dee"):
        tasklease_queue.producer.enqueue("greet", {"who": who}, key=who)
    summary = tasklease_queue.drain(client, duplicate_every=2, lose_response_every=3)
    assert sorted(shop.effects) == ["greet:ann", "greet:bob", "greet:cy", "greet:dee"]
    assert summary.executions("greet") == 4
    injected = [d.injected for d in summary.deliveries if d.injected]
    assert "duplicate" in injected and "lost_response" in injected
    assert summary.outcomes["duplicate"] >= 2  # The twins, and the retries after lost answers.
    assert all(task.done for task in tasklease_queue.tasks)


def test_a_failing_handler_is_retried_with_cloud_tasks_counts(
    shop: Shop, client: flask.testing.FlaskClient, tasklease_queue: StubQueue
) -> None:
    shop.failures_left = 2
    tasklease_queue.producer.enqueue("flaky", {}, key="f")
    summary = tasklease_queue.drain(client)
    assert [d.outcome for d in summary.deliveries] == ["released", "released", "processed"]
    assert [d.retry_count for d in summary.deliveries] == [0, 1, 2]
    last = shop.contexts[-1]
    # 5xx answers are retried but not counted as executions (docs/platform-facts.md).
    assert (last.retry_count, last.execution_count, last.previous_response) == (2, 0, 500)
    assert last.retry_reason == "HTTP 500"
    assert shop.effects == ["flaky"]


def test_a_task_that_never_succeeds_is_given_up_after_max_attempts(shop: Shop) -> None:
    queue = StubQueue(max_attempts=3)
    shop.queue = queue
    shop.failures_left = 10
    queue.producer.enqueue("flaky", {}, key="f")
    summary = queue.drain(shop.client())
    assert summary.outcomes == {"released": 3}
    assert summary.given_up == [queue.tasks[0].task_id]
    assert (queue.tasks[0].done, queue.tasks[0].given_up) == (False, True)
    assert queue.pending() == [] and queue.drain(shop.client()).deliveries == []


def test_a_permanent_failure_is_answered_2xx_and_not_retried(
    client: flask.testing.FlaskClient, tasklease_queue: StubQueue
) -> None:
    tasklease_queue.producer.enqueue("poison", {}, key="p")
    assert tasklease_queue.drain(client).outcomes == {"failed": 1}


def test_a_scheduled_run_fans_out_once_however_often_it_is_delivered(
    shop: Shop,
    client: flask.testing.FlaskClient,
    tasklease_queue: StubQueue,
    tasklease_scheduler: StubScheduler,
) -> None:
    slot = datetime(2026, 3, 1, 3, 0, tzinfo=UTC)
    first = tasklease_scheduler.fire(client, "nightly", at=slot)
    again = tasklease_scheduler.fire(client, "nightly", at=slot)  # Scheduler's at-least-once.
    assert (first.outcome, again.outcome) == ("processed", "duplicate")
    assert [t.handler for t in tasklease_queue.tasks] == ["greet", "greet"]
    summary = tasklease_queue.drain(client, duplicate_every=1)
    assert summary.executions() == 2
    assert shop.effects == ["nightly:2026-03-01T03:00", "greet:ann", "greet:bob"]
    assert shop.contexts[0].job_name == "nightly"


def test_a_manual_run_carries_the_next_slot_and_is_a_run_of_its_own(
    shop: Shop, client: flask.testing.FlaskClient, tasklease_scheduler: StubScheduler
) -> None:
    tasklease_scheduler.add_job("nightly", "0 3 * * *")
    manual = tasklease_scheduler.fire(client, "nightly", at=shop.now, manual=True)
    assert manual.schedule_time == datetime(2026, 3, 2, 3, 0, tzinfo=UTC)
    assert manual.outcome == "processed"
    shop.now = datetime(2026, 3, 2, 3, 0, 5, tzinfo=UTC)  # The slot's own delivery, on time.
    slot = tasklease_scheduler.fire(client, "nightly", at=datetime(2026, 3, 2, 3, tzinfo=UTC))
    assert slot.outcome == "processed"  # Not taken for a duplicate of the manual run.
    assert shop.effects == ["nightly:2026-03-02T03:00"] * 2
    assert shop.contexts[0].run_id != shop.contexts[1].run_id


def test_fire_refuses_what_cloud_scheduler_never_sends(
    client: flask.testing.FlaskClient, tasklease_scheduler: StubScheduler
) -> None:
    with pytest.raises(ValueError, match="add_job"):
        tasklease_scheduler.fire(client, "nightly", manual=True)
    tasklease_scheduler.add_job("nightly", "0 3 * * *", time_zone="America/New_York")
    with pytest.raises(ValueError, match="not a slot"):
        tasklease_scheduler.fire(client, "nightly", at=datetime(2026, 3, 1, 3, tzinfo=UTC))
    with pytest.raises(ValueError, match="timezone-aware"):
        tasklease_scheduler.fire(client, "nightly", at=datetime(2026, 3, 1, 8))
    on_time = tasklease_scheduler.fire(client, "nightly", at=datetime(2026, 3, 1, 8, tzinfo=UTC))
    assert on_time.status == 200  # 03:00 in New York (EST) is 08:00 UTC.


def test_the_plugin_loads_job_schedules_from_the_projects_tasklease_toml(
    pytester: pytest.Pytester,
) -> None:
    pytester.makefile(
        ".toml",
        tasklease='project = "p"\n[[job]]\nname = "digest"\nschedule = "15 6 * * 1"\n',
    )
    pytester.makepyfile(
        """
        def test_schedule(tasklease_scheduler):
            assert tasklease_scheduler.jobs["digest"].schedule == "15 6 * * 1"
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_plugin_is_registered_by_its_entry_point(pytestconfig: pytest.Config) -> None:
    plugin = pytestconfig.pluginmanager.get_plugin("tasklease")
    assert plugin is not None and plugin.__name__ == "tasklease.testing"


def test_importing_the_plugin_loads_neither_flask_nor_googles_clients() -> None:
    """pytest imports the plugin in every project that installs tasklease, tests or not."""
    modules = modules_loaded_by("tasklease.testing")
    heavy = ("flask", "werkzeug", "google", "grpc", "requests", "tasklease.worker")
    assert [m for m in modules if m in heavy or m.startswith(tuple(f"{h}." for h in heavy))] == []
    assert [m for m in modules if m.startswith("tasklease.testing.")] == []


def test_a_drain_that_never_settles_stops_with_a_reason(shop: Shop) -> None:
    queue = StubQueue()
    counter = iter(range(10**6))

    @shop.router.task("chain")
    def chain(payload: dict[str, Any], ctx: TaskContext) -> None:
        queue.producer.enqueue("chain", {}, key=str(next(counter)))

    queue.producer.enqueue("chain", {}, key="start")
    with pytest.raises(RuntimeError, match="did not settle after 50 attempts"):
        queue.drain(shop.client(), limit=50)


def test_executions_counts_every_execution_failed_and_retried_ones_included(
    shop: Shop, client: flask.testing.FlaskClient, tasklease_queue: StubQueue
) -> None:
    shop.failures_left = 2  # Two executions raise, the third completes.
    tasklease_queue.producer.enqueue("flaky", {}, key="f")
    tasklease_queue.producer.enqueue("poison", {}, key="p")
    tasklease_queue.producer.enqueue("greet", {"who": "ann"}, key="a")
    summary = tasklease_queue.drain(client, duplicate_every=1)  # Every attempt sent twice.
    assert summary.executions("flaky") == 3
    assert summary.executions("poison") == 1  # A PermanentFailure: a dead letter, once.
    assert summary.executions("greet") == 1  # Its duplicates ran nothing.
    assert summary.executions() == 5
    assert summary.outcomes["processed"] == 2


SIMULATED_SHOP = """
from datetime import timedelta

from tasklease.worker import Router

LEASE = timedelta(seconds=30)


def shop(sim, *, key_of=None):
    router = Router()

    @router.task("charge", lease=LEASE)
    def charge(payload, ctx):
        for _ in range(payload["steps"]):
            ctx.check_lease()
            sim.effect(ctx, "payments", key=key_of(ctx) if key_of else None)
        sim.effect(ctx, "payments", final=True, key=key_of(ctx) if key_of else None)

    @router.task("deposit", lease=LEASE, concurrency_key=lambda payload: payload["account"])
    def deposit(payload, ctx):
        sim.effect(ctx, "ledger", final=True)

    @router.scheduled("nightly", lease=LEASE, exclusive=True)
    def nightly(ctx):
        sim.effect(ctx, "report")
        sim.effect(ctx, "report", final=True)

    return router


TASKS = [("charge", {"steps": 2}), ("deposit", {"account": "a"}), ("deposit", {"account": "b"})]
"""


def test_the_simulation_fixture_finds_a_careful_router_clean(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        shop=SIMULATED_SHOP,
        test_shop="""
        from shop import TASKS, shop

        def test_clean(tasklease_simulation):
            router = shop(tasklease_simulation)
            report = tasklease_simulation.run(
                router, tasks=TASKS, jobs=["nightly"], seed=5, lifecycles=200
            )
            tasklease_simulation.assert_clean(report)
            assert report.lifecycles == 200 and sum(report.faults.values()) > 0
            assert report.deliveries > report.lifecycles  # Faults made retries.
        """,
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_simulation_fixture_fails_a_handler_keying_its_effect_by_attempt(
    pytester: pytest.Pytester,
) -> None:
    """A planted bug: the handler presents its attempt's id as the idempotency key, so a
    retried lifecycle's downstream sees two keys and would do the effect twice."""
    pytester.makepyfile(
        shop=SIMULATED_SHOP,
        test_shop="""
        from shop import TASKS, shop

        def test_keyed_by_attempt(tasklease_simulation):
            router = shop(tasklease_simulation, key_of=lambda ctx: ctx.attempt_id)
            report = tasklease_simulation.run(router, tasks=TASKS, seed=5, lifecycles=200)
            tasklease_simulation.assert_clean(report)
        """,
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*AssertionError: the simulation found * violation(s) in 200 lifecycles "
            "(seed 5, memory store):",
            "*- one_key_per_lifecycle at t=*s (task:*-charge-u*): its executions presented "
            "2 idempotency keys: *; replay: rerun test_shop.py::test_keyed_by_attempt with "
            "tasklease_simulation.run(..., seed=5, lifecycles=200, store='memory')",
        ]
    )
