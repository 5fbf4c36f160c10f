"""Producer throughput: 5,000 named tasks, one by one and with enqueue_many, in one run.

Measured against local endpoints, each in its own process: a minimal CreateTask stub
answering at once (the producer's own CPU cost bounds the rate), the same stub answering
after 20 ms (about a round trip to the real API from a Cloud Run instance, where concurrency
pays off), and the tasklease emulator with its queue paused (the full REST API).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

from bench.common import BENCH_DIR, child, free_port, tasklease_emulator
from tasklease.producer import CloudTasksTransport, Producer

QUEUE = "projects/bench/locations/us-central1/queues/enqueue"


def measure(endpoint: str, tasks: int, concurrency: int, prefix: str) -> tuple[float, float]:
    if endpoint.startswith("grpc://"):  # The client's default transport, over loopback.
        channel = grpc.insecure_channel(endpoint.removeprefix("grpc://"))
        client = tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))
        transport = CloudTasksTransport(client=client, transport="grpc")
        producer = Producer(
            "bench", "us-central1", "enqueue", "http://127.0.0.1:9/", transport=transport
        )
    else:
        producer = Producer(
            "bench", "us-central1", "enqueue", "http://127.0.0.1:9/", tasks_endpoint=endpoint
        )
    started = time.perf_counter()
    for n in range(tasks):
        producer.enqueue("bench", {"n": n}, key=f"{prefix}-seq-{n}")
    sequential = tasks / (time.perf_counter() - started)
    items = [(f"{prefix}-many-{n}", {"n": n}) for n in range(tasks)]
    started = time.perf_counter()
    results = producer.enqueue_many("bench", items, concurrency=concurrency)
    concurrent = tasks / (time.perf_counter() - started)
    if not all(result.created for result in results):
        raise RuntimeError("some tasks were not created")
    producer.close()
    return sequential, concurrent


def with_stub(
    latency_ms: int,
) -> Callable[[Callable[[str], tuple[float, float]]], tuple[float, float]]:
    def harness(run: Callable[[str], tuple[float, float]]) -> tuple[float, float]:
        port = free_port()
        script = str(Path(__file__).with_name("stub_tasks_api.py"))
        with child(
            [sys.executable, script, str(port), str(latency_ms)], port, BENCH_DIR / "stub.log"
        ):
            return run(f"http://127.0.0.1:{port}")

    return harness


def with_grpc_stub(
    latency_ms: int,
) -> Callable[[Callable[[str], tuple[float, float]]], tuple[float, float]]:
    def harness(run: Callable[[str], tuple[float, float]]) -> tuple[float, float]:
        port = free_port()
        script = str(Path(__file__).with_name("stub_tasks_grpc.py"))
        with child(
            [sys.executable, script, str(port), str(latency_ms)], port, BENCH_DIR / "stub.log"
        ):
            return run(f"grpc://127.0.0.1:{port}")

    return harness


def with_emulator(run: Callable[[str], tuple[float, float]]) -> tuple[float, float]:
    with tasklease_emulator("enqueue") as endpoint:
        admin = Producer("bench", "l", "q", "http://x/", tasks_endpoint=endpoint)
        client = admin.transport.client  # type: ignore[attr-defined]
        client.create_queue(parent=QUEUE.rsplit("/queues/", 1)[0], queue={"name": QUEUE})
        client.pause_queue(name=QUEUE)
        return run(endpoint)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--latency-tasks",
        type=int,
        default=1000,
        help="tasks for the 20 ms endpoint (one by one, they take 20 ms each)",
    )
    args = parser.parse_args()
    print(f"producer: named tasks, one by one vs enqueue_many(concurrency={args.concurrency})")
    endpoints = [
        ("stub, instant", with_stub(0), args.tasks),
        ("stub, 20 ms latency", with_stub(20), args.latency_tasks),
        ("gRPC stub, 20 ms", with_grpc_stub(20), args.latency_tasks),
        ("tasklease emulator", with_emulator, args.tasks),
    ]
    for label, harness, tasks in endpoints:
        sequential, concurrent = harness(
            functools.partial(measure, tasks=tasks, concurrency=args.concurrency, prefix=label[:4])
        )
        print(
            f"  {label:<20} {tasks:5d} tasks: one by one {sequential:6.0f} tasks/s, "
            f"enqueue_many {concurrent:6.0f} tasks/s, ratio {concurrent / sequential:5.2f}x"
        )


if __name__ == "__main__":
    main()
