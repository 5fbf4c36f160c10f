"""Emulator throughput: 2,000 tasks end to end to a trivial handler, against the PyPI
``gcloud-tasks-emulator`` doing the same work, in one run.

Each emulator runs in its own process; the trivial handler (answers 200) runs in another.
A run times from the first create until the handler has received the 2,000th request.
``gcloud-tasks-emulator`` pins protobuf<5, so it is installed into a separate virtual
environment under .tasklease/bench on first use.

The two do different work per task: the tasklease emulator validates every request through
the client library's proto types, stores tasks and tombstones durably in SQLite, and enforces
the queue's rate limit, whose maximum is Cloud Tasks' own 500 dispatches per second per
queue; gcloud-tasks-emulator keeps tasks in memory and dispatches without any limit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import grpc
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

from bench.common import (
    BENCH_DIR,
    child,
    counting_target,
    free_port,
    tasklease_emulator,
    wait_until_received,
)
from producer import CloudTasksTransport, Producer

QUEUE = "projects/bench/locations/us-central1/queues/throughput"
OTHER_VENV = BENCH_DIR / "gcloud-tasks-emulator-venv"


def run_workload(producer: Producer, target: str, tasks: int) -> float:
    """Enqueue ``tasks`` and wait for their delivery; return tasks per second."""
    started = time.monotonic()
    results = producer.enqueue_many("bench", [(f"t{n}", {"n": n}) for n in range(tasks)])
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} creates failed, first: {failed[0].error}")
    finished = wait_until_received(target, tasks)
    return tasks / (finished - started)


def through_tasklease_emulator(tasks: int, target: str) -> float:
    with tasklease_emulator("throughput") as endpoint:
        producer = Producer("bench", "us-central1", "throughput", target, tasks_endpoint=endpoint)
        client = producer.transport.client  # type: ignore[attr-defined]
        client.create_queue(parent=QUEUE.rsplit("/queues/", 1)[0], queue={"name": QUEUE})
        return run_workload(producer, target, tasks)


def gcloud_tasks_emulator(tasks: int, target: str) -> float:
    executable = install_gcloud_tasks_emulator()
    port = free_port()
    command = [str(executable), "start", "--port", str(port), "--quiet", "--default-queue", QUEUE]
    with child(command, port, BENCH_DIR / "gcloud-tasks-emulator.log"):
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        client = tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))
        producer = Producer(
            "bench",
            "us-central1",
            "throughput",
            target,
            transport=CloudTasksTransport(client=client),
        )
        return run_workload(producer, target, tasks)


def install_gcloud_tasks_emulator() -> Path:
    executable = OTHER_VENV / "bin" / "gcloud-tasks-emulator"
    if not executable.exists():
        print("  (installing gcloud-tasks-emulator into its own virtual environment)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(OTHER_VENV)], check=True)
        subprocess.run(
            [
                str(OTHER_VENV / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "gcloud-tasks-emulator==0.6.2",
            ],
            check=True,
        )
    return executable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=2000)
    args = parser.parse_args()
    print(f"emulators: {args.tasks} tasks end to end to a trivial handler")
    with counting_target() as target:
        ours = through_tasklease_emulator(args.tasks, target)
    with counting_target() as target:
        theirs = gcloud_tasks_emulator(args.tasks, target)
    print(f"  tasklease emulator:              {ours:7.0f} tasks/s")
    print(f"  gcloud-tasks-emulator (PyPI):    {theirs:7.0f} tasks/s")
    print(f"  ratio tasklease / gcloud-tasks-emulator: {ours / theirs:5.2f}x")
    print("  (tasklease enforces Cloud Tasks' 500 dispatches/s per queue; the other has no limit)")


if __name__ == "__main__":
    main()
