"""A 10,000-child fan-out/fan-in on the local emulator, against what the queue allows.

End to end: a parent task fans out ``--children`` children (``ctx.fan_out(..., then=)``) into
one queue capped at ``--rate`` dispatches a second (Cloud Tasks' maximum per queue is 500);
the worker is gunicorn with OIDC verification on, on a durable store (SQLite, the embedded
default, or Postgres). The figure is the wall time from the parent's enqueue to the ``then``
handler's run, against the floor the queue sets: children / (queues x rate).

Store operations per child are counted in-process on the same store kind, through the
worker's test client and a queue stub, with and without duplicated deliveries: each call
the executor makes to the store (claims, reads, finishes with their join count).

    python -m bench.fan_in [--children 10000] [--rate 500] [--stores sqlite,postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import ROOT
from tasklease.emulator import CloudTasksEmulator
from tasklease.plumbing.serve import GunicornWorker, free_port
from tasklease.producer import Producer

sys.path.insert(0, str(ROOT))

PROJECT, LOCATION, QUEUE = "bench", "us-central1", "fan-in"
QUEUE_PATH = f"projects/{PROJECT}/locations/{LOCATION}/queues/{QUEUE}"
SERVICE_ACCOUNT = "fan-in@bench.iam.gserviceaccount.com"


@contextmanager
def store_url(kind: str, workdir: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{workdir}/runs.db"
        return
    from tests.support.postgres import running_cluster  # noqa: PLC0415

    with running_cluster() as cluster:
        yield cluster.url()


def end_to_end(kind: str, children: int, rate: int, workdir: Path) -> dict[str, Any]:
    out = workdir / "joined.json"
    port = free_port()
    worker_url = f"http://127.0.0.1:{port}"
    with (
        store_url(kind, workdir) as url,
        CloudTasksEmulator(data_dir=workdir / "emulator") as emulator,
    ):
        emulator.create_queue(
            QUEUE_PATH,
            retryConfig={"minBackoff": "0.1s", "maxBackoff": "2s", "maxAttempts": -1},
            rateLimits={"maxDispatchesPerSecond": rate, "maxConcurrentDispatches": 64},
        )
        producer_env = {
            "TASKLEASE_PROJECT": PROJECT,
            "TASKLEASE_LOCATION": LOCATION,
            "TASKLEASE_QUEUE": QUEUE,
            "TASKLEASE_WORKER_URL": worker_url,
            "TASKLEASE_SERVICE_ACCOUNT": SERVICE_ACCOUNT,
            "TASKLEASE_TASKS_ENDPOINT": emulator.url,
        }
        worker_env = {
            **producer_env,
            "TASKLEASE_ALLOWED_SERVICE_ACCOUNTS": SERVICE_ACCOUNT,
            "TASKLEASE_OIDC_CERTS_URL": emulator.certs_url,
            "TASKLEASE_LOG_LEVEL": "WARNING",
            "BENCH_FAN_IN_OUT": str(out),
        }
        worker = GunicornWorker(
            "bench.fan_in_app:router",
            store=url,
            auth="oidc",
            workers=2,
            threads=32,
            port=port,
            env=worker_env,
            log_path=workdir / "worker.log",
        )
        with worker:
            producer = Producer.from_env(producer_env)
            started = time.time()
            producer.enqueue("fan_parent", {"count": children}, key=f"bench-{started}")
            while not out.exists():
                if time.time() - started > 30 * 60:
                    raise TimeoutError("the join did not close in 30 minutes")
                time.sleep(0.05)
            joined = json.loads(out.read_text())
            deliveries = emulator.deliveries()
    wall = joined["at"] - started
    floor = children / (1 * rate)
    outcomes = Counter(d.outcome for d in deliveries)
    return {
        "store": kind,
        "children": children,
        "wall_s": round(wall, 2),
        "floor_s": round(floor, 2),
        "ratio": round(wall / floor, 2),
        "deliveries": len(deliveries),
        "outcomes": dict(outcomes),
        "summary": joined["summary"],
    }


def operations_per_child(kind: str, children: int, workdir: Path) -> dict[str, Any]:
    """Store calls per child, in-process, plain and with every second delivery duplicated."""
    from bench.fan_in_app import router  # noqa: PLC0415
    from tasklease.testing.stubs import StubQueue  # noqa: PLC0415
    from tasklease.worker import create_app  # noqa: PLC0415
    from tasklease.worker.stores import store_from_url  # noqa: PLC0415

    counts: dict[str, Any] = {}
    for label, duplicate_every in (("plain", 0), ("every 2nd duplicated", 2)):
        with store_url(kind, workdir / label.replace(" ", "-")) as url:
            (workdir / label.replace(" ", "-")).mkdir(exist_ok=True, parents=True)
            store = store_from_url(url)
            calls: Counter[str] = Counter()
            queue = StubQueue().bind(router)
            client = create_app(router, store=count_calls(store, calls), auth="none").test_client()
            os.environ["BENCH_FAN_IN_OUT"] = str(workdir / f"{label}.json")
            queue.producer.enqueue("fan_parent", {"count": children}, key="ops")
            calls.clear()
            queue.drain(client, duplicate_every=duplicate_every, limit=children * 4)
            queue.close()
            store.close()
        counts[label] = {name: round(n / children, 3) for name, n in sorted(calls.items())}
    return counts


COUNTED = (
    "claim", "get", "complete", "fail", "release", "renew", "renew_run", "complete_member",
    "fail_member", "count_member", "get_fan_in", "fan_in_entries", "mark_then_enqueued",
)  # fmt: skip


def count_calls(store: Any, calls: Counter[str]) -> Any:
    """``store`` with each public call the executor makes counted in ``calls``."""
    for name in COUNTED:
        method = getattr(store, name)

        def counted(*args: Any, _name: str = name, _method: Any = method, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _method(*args, **kwargs)

        setattr(store, name, counted)
    return store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--children", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--ops-children", type=int, default=1000)
    args = parser.parse_args(argv)
    for kind in args.stores.split(","):
        with tempfile.TemporaryDirectory(prefix="tasklease-fan-in-") as tmp:
            print(json.dumps(end_to_end(kind, args.children, args.rate, Path(tmp))), flush=True)
        with tempfile.TemporaryDirectory(prefix="tasklease-fan-in-ops-") as tmp:
            ops = operations_per_child(kind, args.ops_children, Path(tmp))
            print(json.dumps({"store": kind, "operations_per_child": ops}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
