"""Producer throughput: 10,000 named tasks with enqueue_many, single creates vs batches.

"single" is ``Producer(batch=False)``: one CreateTask per task, ``concurrency`` in flight (the
producer before BatchCreateTasks); "batch" sends up to 100 tasks per BatchCreateTasks call,
``concurrency`` calls in flight. Both run in the same process against the same endpoint, one
after the other: a minimal stub answering after 20 ms (about a round trip to the real API from
a Cloud Run instance), over REST and gRPC, and the tasklease emulator over gRPC with its queue
paused (the full API and its database; its CPU time per task is read from /proc).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

from bench.common import BENCH_DIR, ROOT, child, free_port, wait_for_port
from tasklease.producer import BatchOutcome, CloudTasksTransport, Producer, TaskRequest

QUEUE = "projects/bench/locations/us-central1/queues/enqueue"


class CountingTransport(CloudTasksTransport):
    """Counts create calls (the emulator and the stubs answer batches done: no GetOperation)."""

    rpcs = 0

    def create_task(self, task: TaskRequest, timeout: float) -> None:
        self.rpcs += 1
        super().create_task(task, timeout)

    def create_tasks(
        self, tasks: Sequence[TaskRequest], request_id: str, timeout: float
    ) -> BatchOutcome:
        self.rpcs += 1
        return super().create_tasks(tasks, request_id, timeout)


@dataclass
class Run:
    seconds: float
    rpcs: int
    server_cpu: float | None = None


def transport_for(endpoint: str) -> CountingTransport:
    if endpoint.startswith("grpc://"):  # The client's default transport, over loopback.
        channel = grpc.insecure_channel(endpoint.removeprefix("grpc://"))
        client = tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))
        return CountingTransport(client=client, transport="grpc")
    return CountingTransport(endpoint=endpoint)


def measure(endpoint: str, tasks: int, concurrency: int, prefix: str, batch: bool) -> Run:
    transport = transport_for(endpoint)
    producer = Producer(
        "bench", "us-central1", "enqueue", "http://127.0.0.1:9/", transport=transport, batch=batch
    )
    producer.enqueue("bench", {}, key=f"{prefix}-warm-up")  # Connections, client set-up.
    transport.rpcs = 0
    items = [(f"{prefix}-{n}", {"n": n}) for n in range(tasks)]
    started = time.perf_counter()
    results = producer.enqueue_many("bench", items, concurrency=concurrency)
    seconds = time.perf_counter() - started
    if not all(result.created for result in results):
        raise RuntimeError(f"some tasks were not created: {results[0]}")
    producer.close()
    return Run(seconds, transport.rpcs)


@contextmanager
def stub(script: str, latency_ms: int) -> Iterator[int]:
    port = free_port()
    path = str(Path(__file__).with_name(script))
    with child([sys.executable, path, str(port), str(latency_ms)], port, BENCH_DIR / "stub.log"):
        yield port


@contextmanager
def emulator() -> Iterator[tuple[str, int]]:
    """``tasklease emulator`` in its own process: its gRPC target and its pid."""
    port, grpc_port = free_port(), free_port()
    command = [
        *(sys.executable, "-m", "tasklease.cli", "emulator", "--port", str(port)),
        *("--grpc-port", str(grpc_port), "--data-dir", str(BENCH_DIR / f"enqueue-{port}")),
    ]
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    with (BENCH_DIR / "enqueue-emulator.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_for_port(port)
        wait_for_port(grpc_port)
        client = transport_for(f"grpc://127.0.0.1:{grpc_port}").client
        client.create_queue(parent=QUEUE.rsplit("/queues/", 1)[0], queue={"name": QUEUE})
        client.pause_queue(name=QUEUE)
        yield f"grpc://127.0.0.1:{grpc_port}", process.pid
    finally:
        process.terminate()
        process.wait(timeout=10)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def compare(label: str, endpoint: str, args: argparse.Namespace, pid: int | None = None) -> None:
    runs: dict[str, Run] = {}
    for mode in ("single", "batch"):
        before = cpu_seconds(pid) if pid else 0.0
        prefix = f"{label[:4]}-{mode}"
        run = measure(endpoint, args.tasks, args.concurrency, prefix, mode == "batch")
        if pid:
            run.server_cpu = cpu_seconds(pid) - before
        runs[mode] = run
    single, batch = runs["single"], runs["batch"]
    print(f"  {label}, {args.tasks} tasks:")
    for mode, run in runs.items():
        cpu = (
            f", emulator CPU {run.server_cpu / args.tasks * 1e3:.3f} ms/task"
            if run.server_cpu is not None
            else ""
        )
        print(
            f"    {mode:<6} {run.seconds:7.2f} s {args.tasks / run.seconds:7.0f} tasks/s "
            f"{run.rpcs:6d} RPCs{cpu}"
        )
    print(f"    batch is {single.seconds / batch.seconds:.1f}x faster")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency-ms", type=int, default=20)
    args = parser.parse_args()
    print(f"producer: enqueue_many(concurrency={args.concurrency}), single creates vs batches")
    with stub("stub_tasks_api.py", args.latency_ms) as port:
        compare(f"REST stub, {args.latency_ms} ms", f"http://127.0.0.1:{port}", args)
    with stub("stub_tasks_grpc.py", args.latency_ms) as port:
        compare(f"gRPC stub, {args.latency_ms} ms", f"grpc://127.0.0.1:{port}", args)
    with emulator() as (target, pid):
        compare("tasklease emulator, gRPC", target, args, pid)


if __name__ == "__main__":
    main()
