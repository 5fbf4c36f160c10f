"""Emulator throughput: 2,000 tasks end to end over 4 queues to a trivial handler, through
the tasklease emulator over REST and over gRPC, and through the PyPI
``gcloud-tasks-emulator`` doing the same work, in one run.

Each emulator runs in its own process; the trivial handler (answers 200) runs in another.
A run times from the first create until the handler has received the last request. The
tasks are spread evenly over 4 queues and created by 4 producers at once, one per queue.
``gcloud-tasks-emulator`` pins protobuf<5, so it is installed into a separate virtual
environment under .tasklease/bench on first use.

The two do different work per task: the tasklease emulator validates every request through
the client library's proto types, de-duplicates task names (tombstones included), stores
tasks durably in SQLite, and caps each queue at Cloud Tasks' own maximum of 500 dispatches
per second (so 2,000 per second over the 4 queues at best); gcloud-tasks-emulator keeps
tasks in memory, does not de-duplicate names and dispatches without any limit.

    python -m bench.emulator_throughput [--tasks 2000] [--queues 4] [--rounds 1]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import grpc
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

from bench.common import (
    BENCH_DIR,
    child,
    counting_target,
    free_port,
    wait_for_port,
    wait_until_received,
)
from tasklease.producer import CloudTasksTransport, Producer

PARENT = "projects/bench/locations/us-central1"
OTHER_VENV = BENCH_DIR / "gcloud-tasks-emulator-venv"


def queue_ids(queues: int) -> list[str]:
    return [f"throughput-{n}" for n in range(queues)]


def run_workload(
    producers: list[Producer], target: str, tasks: int, tag: str, received_before: int = 0
) -> float:
    """Enqueue ``tasks`` spread over the producers' queues, all at once; wait for their
    delivery; return tasks per second."""
    share = [range(n, tasks, len(producers)) for n in range(len(producers))]
    started = time.monotonic()
    with ThreadPoolExecutor(len(producers)) as pool:
        batches = pool.map(
            lambda pair: pair[0].enqueue_many(
                "bench", [(f"{tag}-{n}", {"n": n}) for n in pair[1]], concurrency=8
            ),
            zip(producers, share, strict=True),
        )
        failed = [r for batch in batches for r in batch if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} creates failed, first: {failed[0].error}")
    created = time.monotonic()
    finished = wait_until_received(target, received_before + tasks)
    print(
        f"    {tag}: created in {created - started:.2f} s, "
        f"delivered {finished - created:.2f} s later"
    )
    return tasks / (finished - started)


def grpc_client(address: str) -> tasks_v2.CloudTasksClient:
    channel = grpc.insecure_channel(address)
    return tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))


@contextmanager
def tasklease_emulator(name: str) -> Iterator[tuple[str, str]]:
    """``tasklease emulator`` in its own process, with a fresh data folder and both ports
    chosen free (the default gRPC port, REST + 1, may be taken): its REST endpoint and its
    gRPC address."""
    port, grpc_port = free_port(), free_port()
    command = [
        *(sys.executable, "-m", "tasklease.cli", "emulator"),
        *("--port", str(port), "--grpc-port", str(grpc_port)),
        *("--data-dir", str(BENCH_DIR / f"{name}-{port}")),
    ]
    with child(command, port, BENCH_DIR / f"{name}-emulator.log"):
        wait_for_port(grpc_port)
        yield f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"


@contextmanager
def tasklease(transport: str, queues: int, target: str) -> Iterator[list[Producer]]:
    with tasklease_emulator(f"throughput-{transport}") as (endpoint, grpc_address):
        rest = Producer("bench", "us-central1", "x", target, tasks_endpoint=endpoint)
        admin = rest.transport.client  # type: ignore[attr-defined]
        for queue in queue_ids(queues):
            admin.create_queue(parent=PARENT, queue={"name": f"{PARENT}/queues/{queue}"})
        if transport == "rest":
            yield [
                Producer("bench", "us-central1", queue, target, tasks_endpoint=endpoint)
                for queue in queue_ids(queues)
            ]
        else:
            client = grpc_client(grpc_address)
            yield [
                Producer(
                    "bench",
                    "us-central1",
                    queue,
                    target,
                    transport=CloudTasksTransport(client=client),
                )
                for queue in queue_ids(queues)
            ]


@contextmanager
def gcloud_tasks_emulator(queues: int, target: str) -> Iterator[list[Producer]]:
    executable = install_gcloud_tasks_emulator()
    port = free_port()
    first = f"{PARENT}/queues/{queue_ids(queues)[0]}"
    command = [str(executable), "start", "--port", str(port), "--quiet", "--default-queue", first]
    with child(command, port, BENCH_DIR / "gcloud-tasks-emulator.log"):
        client = grpc_client(f"127.0.0.1:{port}")
        for queue in queue_ids(queues)[1:]:
            client.create_queue(
                parent=PARENT, queue=tasks_v2.Queue(name=f"{PARENT}/queues/{queue}")
            )
        yield [
            Producer(
                "bench", "us-central1", queue, target, transport=CloudTasksTransport(client=client)
            )
            for queue in queue_ids(queues)
        ]


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


def measure(
    setup: Callable[[str], AbstractContextManager[list[Producer]]],
    tasks: int,
    rounds: int,
    name: str,
) -> float:
    """The best of ``rounds`` runs, each on a fresh emulator and target, after a warm-up."""
    best = 0.0
    for _ in range(rounds):
        with counting_target() as target, setup(target) as producers:
            warm_up = len(producers) * 25
            run_workload(producers, target, warm_up, f"warm-{name}")
            best = max(best, run_workload(producers, target, tasks, name, warm_up))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1, help="best of this many runs each")
    args = parser.parse_args()
    print(f"emulators: {args.tasks} tasks end to end over {args.queues} queues")
    results = {
        "tasklease emulator, REST": measure(
            lambda t: tasklease("rest", args.queues, t), args.tasks, args.rounds, "rest"
        ),
        "tasklease emulator, gRPC": measure(
            lambda t: tasklease("grpc", args.queues, t), args.tasks, args.rounds, "grpc"
        ),
        "gcloud-tasks-emulator (PyPI, gRPC)": measure(
            lambda t: gcloud_tasks_emulator(args.queues, t), args.tasks, args.rounds, "other"
        ),
    }
    theirs = results["gcloud-tasks-emulator (PyPI, gRPC)"]
    for name, rate in results.items():
        print(f"  {name:36} {rate:7.0f} tasks/s  ({rate / theirs:4.2f}x)")
    print(
        f"  (tasklease caps each queue at 500 dispatches/s: {500 * args.queues}/s at best here;"
        " the other has no limit)"
    )


if __name__ == "__main__":
    main()
