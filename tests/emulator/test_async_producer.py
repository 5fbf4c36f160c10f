"""AsyncProducer against the local emulator over gRPC (CloudTasksAsyncClient, grpc_asyncio):
creates, name de-duplication, batches, fan-out, errors, the router check, enqueue by
reference; and a slow API that must not stall the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from google.cloud import tasks_v2

import tasklease
from tasklease.emulator import CloudTasksEmulator
from tasklease.producer import (
    AsyncProducer,
    FanOutIncomplete,
    InvalidTask,
    PermanentEnqueueError,
    Producer,
    RetryPolicy,
    task_id,
)
from tasklease.testing.stubs import StubQueue
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores import MemoryStore
from tests.producer.test_producer_grpc import FakeGrpcCloudTasks, serve_create_task

PARENT = "projects/p/locations/us-central1"
QUEUE = f"{PARENT}/queues/q"
WORKER = "http://127.0.0.1:9"  # Never reached: the queue is paused.


@dataclass(frozen=True)
class Run:
    run_id: str


@pytest.fixture
def paused_queue(emulator: CloudTasksEmulator) -> CloudTasksEmulator:
    client = emulator.client("grpc")
    client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=QUEUE))
    client.pause_queue(name=QUEUE)
    return emulator


def producer(emulator: CloudTasksEmulator, **options: Any) -> AsyncProducer:
    return AsyncProducer(
        "p",
        "us-central1",
        "q",
        WORKER,
        "sa@p.iam.gserviceaccount.com",
        tasks_endpoint=emulator.grpc_target,
        retry=RetryPolicy(max_attempts=3, initial=0.001, maximum=0.001),
        **options,
    )


def stored(emulator: CloudTasksEmulator) -> dict[str, tasks_v2.Task]:
    client = emulator.client("grpc")
    view = tasks_v2.Task.View.FULL
    request = tasks_v2.ListTasksRequest(parent=QUEUE, response_view=view)
    return {t.name: t for t in client.list_tasks(request=request)}


def test_enqueue_creates_the_task_producer_would_and_a_repeat_is_absorbed(
    paused_queue: CloudTasksEmulator,
) -> None:
    async def main() -> tuple[bool, bool, str]:
        async with producer(paused_queue) as async_producer:
            first = await async_producer.enqueue("send_receipt", {"order_id": 42}, key="o-42")
            again = await async_producer.enqueue("send_receipt", {"order_id": 42}, key="o-42")
            return first.created, again.created, first.task_id

    created, repeated, name = asyncio.run(main())
    assert (created, repeated) == (True, False)
    assert name == task_id("send_receipt", "o-42")  # The sync producer's naming.
    [task] = stored(paused_queue).values()
    assert task.http_request.url == f"{WORKER}/tasks/send_receipt"
    assert task.http_request.body == b'{"order_id":42}'
    assert task.http_request.oidc_token.service_account_email == "sa@p.iam.gserviceaccount.com"
    # The sync producer sees the same name as taken.
    sync = Producer("p", "us-central1", "q", WORKER, tasks_endpoint=paused_queue.url)
    assert not sync.enqueue("send_receipt", {"order_id": 42}, key="o-42").created


@pytest.mark.parametrize("batch", [True, False])
def test_enqueue_many_creates_each_item_once_in_order(
    paused_queue: CloudTasksEmulator, batch: bool
) -> None:
    items = [(f"k{i}", {"i": i}) for i in range(130)]  # Two batches of one queue.

    async def main() -> tuple[list[bool], list[bool]]:
        async with producer(paused_queue, batch=batch) as async_producer:
            await async_producer.enqueue("t", {"i": 0}, key="k0")
            results = await async_producer.enqueue_many("t", items, concurrency=4)
            again = await async_producer.enqueue_many("t", items[:3])
            return [r.created for r in results], [r.created for r in again]

    created, again = asyncio.run(main())
    assert created == [False] + [True] * 129
    assert again == [False, False, False]
    assert len(stored(paused_queue)) == 130


def test_fan_out_keys_children_by_the_run_and_a_redelivered_run_creates_nothing(
    paused_queue: CloudTasksEmulator,
) -> None:
    async def main() -> tuple[list[bool], list[bool], list[bool]]:
        async with producer(paused_queue) as async_producer:
            items = [("a", 1), ("b", 2)]
            first = await async_producer.fan_out(Run("run-1"), "child", items)
            redelivered = await async_producer.fan_out(Run("run-1"), "child", items)
            next_run = await async_producer.fan_out(Run("run-2"), "child", items)
        return (
            [r.created for r in first],
            [r.created for r in redelivered],
            [r.created for r in next_run],
        )

    assert asyncio.run(main()) == ([True, True], [False, False], [True, True])


def test_fan_out_into_a_missing_queue_raises_fan_out_incomplete_naming_every_key(
    paused_queue: CloudTasksEmulator,
) -> None:
    async def main() -> None:
        async with producer(paused_queue) as async_producer:
            await async_producer.fan_out(Run("r"), "child", [("a", 1), ("b", 2)], queue="nope")

    with pytest.raises(FanOutIncomplete, match=r"2 of 2 fan-out tasks not created") as caught:
        asyncio.run(main())
    assert caught.value.failed_keys == ["a", "b"]


def test_errors_are_the_sync_producers_types_and_messages(
    paused_queue: CloudTasksEmulator,
) -> None:
    sync = Producer("p", "us-central1", "nope", WORKER, tasks_endpoint=paused_queue.url)
    with pytest.raises(PermanentEnqueueError) as sync_error:
        sync.enqueue("t", {}, key="k")

    async def main() -> None:
        async with AsyncProducer(
            "p", "us-central1", "nope", WORKER, tasks_endpoint=paused_queue.grpc_target
        ) as async_producer:
            with pytest.raises(InvalidTask, match="JSON-serialisable"):
                await async_producer.enqueue("t", {1, 2})
            await async_producer.enqueue("t", {}, key="k")

    with pytest.raises(PermanentEnqueueError) as async_error:
        asyncio.run(main())
    assert str(async_error.value).split(" (")[0] == str(sync_error.value).split(" (")[0]
    assert "queue projects/p/locations/us-central1/queues/nope not found" in str(async_error.value)


def test_a_router_refuses_a_name_it_has_no_handler_for_and_aenqueue_goes_by_reference(
    paused_queue: CloudTasksEmulator,
) -> None:
    router = Router()

    @router.task()
    def send_receipt(payload: dict[str, int], ctx: TaskContext) -> None: ...

    async def main() -> bool:
        async with producer(paused_queue, router=router) as async_producer:
            with pytest.raises(InvalidTask, match="no task handler"):
                await async_producer.enqueue("send_reciept", {})
            previous = router.use_async_producer(async_producer)
            try:
                result = await send_receipt.aenqueue({"order_id": 1}, key="o-1")
                many = await send_receipt.aenqueue_many([("o-2", {"order_id": 2})])
                children = await send_receipt.afan_out(Run("run"), [("o-3", {"order_id": 3})])
            finally:
                router.use_async_producer(previous)
            return result.created and many[0].created and children[0].created

    assert asyncio.run(main())
    urls = {t.http_request.url for t in stored(paused_queue).values()}
    assert urls == {f"{WORKER}/tasks/send_receipt"}
    assert len(stored(paused_queue)) == 3


def test_from_env_reaches_the_emulator_over_grpc_and_the_default_router_producer_too(
    paused_queue: CloudTasksEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKLEASE_PROJECT", "p")
    monkeypatch.setenv("TASKLEASE_LOCATION", "us-central1")
    monkeypatch.setenv("TASKLEASE_QUEUE", "q")
    monkeypatch.setenv("TASKLEASE_WORKER_URL", WORKER)
    monkeypatch.setenv("TASKLEASE_TASKS_GRPC_ENDPOINT", paused_queue.grpc_target)
    router = Router()

    @router.task()
    def ping(payload: None, ctx: TaskContext) -> None: ...

    async def main() -> bool:
        result = await ping.aenqueue(None, key="once")
        await router.async_producer().aclose()
        return result.created

    assert asyncio.run(main())
    assert tasklease.AsyncProducer is AsyncProducer

    # A second loop gets a producer of its own: a gRPC channel never crosses loops.
    made: list[AsyncProducer] = []

    async def again(key: str) -> bool:
        made.append(router.async_producer())
        return (await ping.aenqueue(None, key=key)).created

    assert asyncio.run(again("second")) and asyncio.run(again("third"))
    assert made[0] is not made[1]


def test_from_env_takes_the_emulators_grpc_port_next_to_its_rest_port() -> None:
    env = {
        "TASKLEASE_PROJECT": "p",
        "TASKLEASE_LOCATION": "us-central1",
        "TASKLEASE_WORKER_URL": WORKER,
        "TASKLEASE_TASKS_ENDPOINT": "http://127.0.0.1:8123",
    }
    made = AsyncProducer.from_env(env)
    assert made.transport._endpoint == "127.0.0.1:8124"  # type: ignore[attr-defined]


class GatedCloudTasks(FakeGrpcCloudTasks):
    """CreateTask that holds every call until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.waiting = 0
        self.lock = threading.Lock()

    def create_task(self, request: tasks_v2.CreateTaskRequest, context: Any) -> tasks_v2.Task:
        with self.lock:
            self.waiting += 1
        self.gate.wait(30)
        return super().create_task(request, context)


@pytest.fixture
def gated() -> Iterator[tuple[GatedCloudTasks, int]]:
    fake = GatedCloudTasks()
    server, port = serve_create_task(fake)
    yield fake, port
    fake.gate.set()
    server.stop(None)


def test_the_loop_keeps_serving_while_fifty_creates_wait_on_a_slow_api(
    gated: tuple[GatedCloudTasks, int],
) -> None:
    fake, port = gated
    ticks_while_waiting = 0

    async def main() -> list[bool]:
        nonlocal ticks_while_waiting
        async_producer = AsyncProducer(
            "p", "us-central1", "q", WORKER, tasks_endpoint=f"127.0.0.1:{port}", timeout=60
        )
        creates = [
            asyncio.ensure_future(async_producer.enqueue("t", {"i": i}, key=f"k{i}"))
            for i in range(50)
        ]
        # The API holds all 50 creates; the loop must keep running this ticker meanwhile.
        while fake.waiting < 50 or ticks_while_waiting < 20:
            await asyncio.sleep(0.01)
            assert not any(create.done() for create in creates)
            ticks_while_waiting += 1
            assert ticks_while_waiting < 3000, f"only {fake.waiting} creates reached the API"
        fake.gate.set()
        results = await asyncio.gather(*creates)
        await async_producer.aclose()
        return [result.created for result in results]

    assert asyncio.run(main()) == [True] * 50
    assert ticks_while_waiting >= 20
    assert len(fake.tasks) == 50


def test_an_async_handler_enqueues_by_reference_into_the_plugins_stub_queue(
    tasklease_queue: StubQueue,
) -> None:
    router = Router()

    @router.task()
    async def child(payload: dict[str, int], ctx: TaskContext) -> None: ...

    @router.task()
    async def parent(payload: dict[str, int], ctx: TaskContext) -> None:
        await child.aenqueue({"n": payload["n"] + 1}, key=f"child-{payload['n']}")

    tasklease_queue.bind(router)

    async def start() -> bool:
        return (await parent.aenqueue({"n": 1}, key="p")).created

    assert asyncio.run(start())
    client = create_app(router, store=MemoryStore(), auth="none").test_client()
    assert tasklease_queue.drain(client).outcomes == {"processed": 2}
    assert [t.handler for t in tasklease_queue.tasks] == ["parent", "child"]
    tasklease_queue.close()
    assert router.use_async_producer(None) is None  # Given back on close.
