"""Enqueue by reference: the decorated handler carries its route, and enqueues through the
router's producer (or one given), into the right handler and queue."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tasklease.errors import ConfigurationError
from tasklease.producer import InvalidTask, MemoryTransport, Producer, task_id
from tasklease.testing.stubs import StubQueue
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.identity import Kind
from tasklease.worker.stores import MemoryStore


def producer_for() -> Producer:
    return Producer(
        "shop", "us-central1", "default", "https://worker.test", transport=MemoryTransport()
    )


@pytest.fixture
def router() -> Router:
    return Router()


@pytest.fixture
def producer(router: Router) -> Iterator[Producer]:
    producer = producer_for()
    router.use_producer(producer)
    yield producer
    producer.close()


def created(producer: Producer) -> list[Any]:
    transport = producer.transport
    assert isinstance(transport, MemoryTransport)
    return [task.request for task in transport.tasks]


def test_a_handler_enqueues_itself_under_its_name_and_key(
    router: Router, producer: Producer
) -> None:
    @router.task()
    def send_receipt(payload: dict[str, int], ctx: TaskContext) -> None:
        return None

    result = send_receipt.enqueue({"order_id": 42}, key="order-42")
    again = send_receipt.enqueue({"order_id": 42}, key="order-42")
    assert (result.created, again.created) == (True, False)
    [request] = created(producer)
    assert request.url == "https://worker.test/tasks/send_receipt"
    assert request.task_id == task_id("send_receipt", "order-42")
    assert request.body == b'{"order_id":42}'
    assert send_receipt.name == "send_receipt" and send_receipt.path == "/tasks/send_receipt"


def test_the_handlers_queue_is_the_default_and_the_call_may_name_another(
    router: Router, producer: Producer
) -> None:
    @router.task("mail", queue="emails")
    async def mail(payload: Any, ctx: TaskContext) -> None:
        return None

    mail.enqueue(None, key="a")
    mail.enqueue(None, key="b", queue="urgent")
    assert [r.queue_path.rsplit("/", 1)[-1] for r in created(producer)] == ["emails", "urgent"]


def test_a_producer_given_to_the_call_wins_over_the_routers(
    router: Router, producer: Producer
) -> None:
    @router.task()
    def h(payload: Any, ctx: TaskContext) -> None:
        return None

    other = producer_for()
    h.enqueue({"n": 1}, producer=other)
    assert (len(created(producer)), len(created(other))) == (0, 1)


def test_enqueue_many_and_fan_out_by_reference(router: Router, producer: Producer) -> None:
    @router.task()
    def greet(payload: dict[str, str], ctx: TaskContext) -> None:
        return None

    @router.scheduled()
    def nightly(ctx: TaskContext) -> None:
        greet.fan_out(ctx, [(w, {"who": w}) for w in ("ann", "bob")])

    results = greet.enqueue_many([("x", {"who": "x"})])
    assert [r.created for r in results] == [True]
    ctx = TaskContext("scheduler", "nightly", "run-1" * 8, "a" * 32, 1, 1, datetime.now(UTC))
    nightly(ctx)
    assert {r.task_id for r in created(producer)} == {
        task_id("greet", "x"),
        task_id("greet", f"{ctx.run_id}/ann"),
        task_id("greet", f"{ctx.run_id}/bob"),
    }


def test_the_handle_calls_the_function_as_written() -> None:
    router = Router()

    @router.task()
    async def double(payload: int, ctx: TaskContext) -> int:
        """Doubles."""
        return payload * 2

    ctx = TaskContext("task", "double", "r" * 64, "a" * 32, 1, 1, datetime.now(UTC))
    assert asyncio.run(double(21, ctx)) == 42
    assert (double.__name__, double.__doc__) == ("double", "Doubles.")
    spec = router.handler(Kind.TASK, "double")
    assert spec is not None and spec.function is double.__wrapped__


def test_a_handle_registered_on_a_second_router_registers_its_function() -> None:
    first, second = Router(), Router()

    def h(payload: Any, ctx: TaskContext) -> None:
        return None

    second.task()(first.task()(h))
    spec = second.handler(Kind.TASK, "h")
    assert spec is not None and spec.function is h


def test_the_default_producer_comes_from_the_environment_and_knows_the_router(
    router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in [
        ("TASKLEASE_PROJECT", "shop"),
        ("TASKLEASE_LOCATION", "us-central1"),
        ("TASKLEASE_WORKER_URL", "https://worker.test"),
    ]:
        monkeypatch.setenv(name, value)
    default = router.producer()
    assert (default.project, default.router, router.producer()) == ("shop", router, default)
    with pytest.raises(InvalidTask, match="no task handler"):
        default.enqueue("nowhere", {})
    default.close()


def test_without_a_producer_or_its_environment_the_refusal_says_how_to_give_one(
    router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TASKLEASE_PROJECT", "GOOGLE_CLOUD_PROJECT", "TASKLEASE_WORKER_URL"):
        monkeypatch.delenv(name, raising=False)

    @router.task()
    def h(payload: Any, ctx: TaskContext) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"router\.use_producer"):
        h.enqueue({})


def test_a_stub_queue_bound_to_a_router_takes_its_enqueues_and_delivers_them() -> None:
    router = Router()
    effects: list[str] = []

    @router.task()
    async def ship(payload: dict[str, int], ctx: TaskContext) -> None:
        effects.append(f"ship:{payload['order_id']}")

    @router.task()
    def pay(payload: dict[str, int], ctx: TaskContext) -> None:
        effects.append(f"pay:{payload['order_id']}")
        ship.enqueue(payload, key=f"ship-{payload['order_id']}")  # A chain, by reference.

    before = producer_for()
    router.use_producer(before)
    queue = StubQueue().bind(router)
    pay.enqueue({"order_id": 7}, key="order-7")
    with pytest.raises(InvalidTask, match="no task handler"):
        queue.producer.enqueue("shipp", {})
    summary = queue.drain(create_app(router, store=MemoryStore(), auth="none").test_client())
    assert effects == ["pay:7", "ship:7"]
    assert summary.executions() == 2
    queue.close()
    assert router.producer() is before
    before.close()


def test_the_plugins_queue_fixture_binds_a_router(tasklease_queue: StubQueue) -> None:
    router = Router()

    @router.task()
    def greet(payload: dict[str, str], ctx: TaskContext) -> dict[str, str]:
        return {"greeted": payload["who"]}

    tasklease_queue.bind(router)
    greet.enqueue({"who": "ann"}, key="ann")
    assert [t.handler for t in tasklease_queue.tasks] == ["greet"]
    client = create_app(router, store=MemoryStore(), auth="none").test_client()
    assert tasklease_queue.drain(client).outcomes == {"processed": 1}
